# One image for every Tessera role (completed by the client/CLI issue: masters, tablet servers,
# Spark and the job runner). Java is needed by the Spark jobs.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/tessera
COPY pyproject.toml README.md ./
COPY service ./service
COPY spark_jobs ./spark_jobs
COPY conf /etc/tessera
RUN pip install --no-cache-dir .
ENTRYPOINT []
