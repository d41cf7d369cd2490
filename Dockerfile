# One image for every role of docker-compose.yml: masters, tablet servers, the Spark standalone
# master and worker, and the job runner. Build from the repository root: `docker compose build`.
#
# The base is pinned to Debian bookworm: PySpark 4.x needs Java 17, and bookworm
# is the Debian release that packages openjdk-17-jre-headless (newer ones dropped Java 17).
# procps gives Spark's shell scripts the `ps` they call.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

# PySpark is installed by `pip install .` below; its distribution carries Spark itself
# (pyspark/bin/spark-class, pyspark/jars), so SPARK_HOME is the package directory. Workers run
# PYSPARK_PYTHON: unset, they would look for a python3 without Tessera's packages.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python

WORKDIR /opt/tessera
COPY pyproject.toml README.md ./
COPY service ./service
COPY spark_jobs ./spark_jobs
RUN pip install --no-cache-dir .

# Documented defaults; docker-compose.yml also mounts ./conf here read-only, so an edited conf
# takes effect on restart without a rebuild.
COPY conf /etc/tessera

# Servers run unprivileged. Named volumes mounted on these directories start as copies of them,
# ownership included, so the data directories are writable by `tessera`; the `pki` volume
# (/var/lib/tessera-pki, where `tessera security provision` writes) starts owner-only.
RUN useradd --system --create-home --home-dir /home/tessera tessera \
    && mkdir -p /var/lib/tessera /var/lib/spark /var/lib/tessera-pki \
    && chown tessera:tessera /var/lib/tessera /var/lib/spark /var/lib/tessera-pki \
    && chmod 0700 /var/lib/tessera-pki
USER tessera

# No entry point: each compose service names its command (`tessera master run ...`, spark-class).
ENTRYPOINT []
CMD ["tessera", "--help"]
