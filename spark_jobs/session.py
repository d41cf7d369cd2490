"""The one way Tessera builds a SparkSession: Delta configured, quiet, sized for small machines.

Theory of operation
-------------------
A session's configuration is layered, later layers winning:

1. ``_BUILTIN_DEFAULTS`` below: what Tessera cannot run without (Delta's extension and catalog)
   plus small-machine sizing. They make the module work even where the
   repository's ``conf/`` is absent (an installed wheel).
2. ``conf/spark-defaults.conf`` of the repository (``key  value`` lines, ``#`` comments), with
   ``{data}`` replaced by `spark_data_dir` (the warehouse lives outside the source
   tree) and ``{repo}`` by the repository root.
3. ``$SPARK_MASTER_URL`` for the master (docker-compose's job runner sets it).
4. What spark-submit launched the process with (``--master``, ``--conf``, ``--packages``, the
   installation's spark-defaults.conf): our defaults never override a key it set
   (:func:`launcher_settings`).
5. The ``conf`` mapping given to :func:`build_session`.
6. The ``master`` and ``warehouse_dir`` keyword arguments.

Delta's JVM half is not on PyPI. Its jars are named in ``spark.jars.packages`` and spark-submit
resolves them with Ivy while it launches the driver JVM: from Maven Central the first time (eight
jars, 13 MB), afterwards from the Ivy cache (``~/.ivy2.5.2`` in Spark 4, or
``spark.jars.ivy``). Spark's Ivy chain also looks in ``~/.m2/repository`` first, so
``mvn dependency:get`` is an offline way to seed it. If the delta-spark jar sits in the
repository's git-ignored ``jars/`` folder, those jars are used through ``spark.jars`` instead and
Ivy is not involved at all. When the JVM cannot start and the Delta jar is nowhere to be found,
:func:`build_session` tries the download again and then, where Maven is installed, fetches the
jars with ``mvn dependency:get`` before a last try; only then does it raise
:class:`SparkSessionError` saying what to do.

Workers are separate Python processes started by the JVM. They run ``PYSPARK_PYTHON``, which,
unset, means the system ``python3`` without Tessera's packages; so it is set to this interpreter.

A JVM hosts one SparkContext: when a session already exists, ``getOrCreate`` returns it, and
settings that are fixed at JVM launch (jars, driver memory, warehouse) keep their first values.
Build the session once per process (tests: the session-scoped ``spark`` fixture).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from spark_jobs.catalog import CATALOG_IMPLEMENTATION, hive_requested, register_tables

__all__ = [
    "DEFAULTS_FILE",
    "DELTA_SETTINGS",
    "LOG4J2_FILE",
    "REPO_ROOT",
    "SparkSessionError",
    "build_session",
    "delta_package",
    "read_spark_defaults",
    "require_delta",
    "spark_data_dir",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULTS_FILE = REPO_ROOT / "conf" / "spark-defaults.conf"
LOG4J2_FILE = REPO_ROOT / "conf" / "log4j2.properties"
# Git-ignored (/jars/): the no-Ivy fallback. Put delta-spark_*.jar and its dependencies here.
JARS_DIR = REPO_ROOT / "jars"

# Spark 4's default for spark.jars.ivy (Spark 3 used ~/.ivy2; the cache layout changed with
# Ivy 2.5.2, hence the new directory).
DEFAULT_IVY_DIR = Path.home() / ".ivy2.5.2"

SCALA_BINARY_VERSION = "2.13"  # every Spark 4 build; the suffix of every Delta 4 artifact
LOG_LEVEL = "WARN"

_PACKAGES = "spark.jars.packages"
_JARS = "spark.jars"
_IVY = "spark.jars.ivy"
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_DELTA_PREFIX = "io.delta:delta-spark_"
_DELTA_ARTIFACT = re.compile(r"^io\.delta:delta-spark_(\d+\.\d+)_(\d+\.\d+):(\d+)\.(\d+)\.\S+$")

_BUILTIN_DEFAULTS: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A catalog per session, rebuilt from the warehouse: no Derby metastore for concurrent jobs
    # to fight over (spark_jobs/catalog.py).
    "spark.sql.catalogImplementation": "in-memory",
    # Delta rebuilds table state with a job of this many partitions (default 50, ~10 s here).
    "spark.databricks.delta.snapshotPartitions": "2",
    # Two cores: the UI costs start-up time and a port, 200 shuffle partitions cost 200 tasks.
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
}


class SparkSessionError(RuntimeError):
    """The SparkSession could not be built; the message says what to do about it."""


DATA_DIR_ENV = "TESSERA_SPARK_HOME"


def spark_data_dir() -> Path:
    """Where sessions keep their warehouse (the audit tables) by default: $TESSERA_SPARK_HOME,
    else $XDG_DATA_HOME/tessera/spark, else ~/.local/share/tessera/spark. Outside the source
    tree: a job run from a checkout must not write its tables into it, and two checkouts share
    one set of audit tables."""
    explicit = os.environ.get(DATA_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser().resolve() / "tessera" / "spark"


def read_spark_defaults(path: Path = DEFAULTS_FILE) -> dict[str, str]:
    """Parse a spark-defaults.conf: ``key value`` (or ``key=value``) lines, ``#``/``!`` comments.

    A trailing backslash continues a value on the next line, whose leading blanks are dropped (the
    Java properties rule spark-submit follows). ``{repo}`` in a value becomes the absolute
    repository root, ``{data}`` the Spark state directory (`spark_data_dir`). A missing file
    yields ``{}``.
    """
    if not path.is_file():
        return {}
    result: dict[str, str] = {}
    logical, first_lineno = "", 0
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        first_lineno = first_lineno or lineno
        if line.endswith("\\"):  # continued on the next line, as in Java properties
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"^([^\s=]+)\s*[\s=]\s*(.*)$", logical)
        if match is None or not match.group(2):
            raise ValueError(f"{path}:{first_lineno}: expected 'key value', got {logical!r}")
        value = match.group(2).replace("{repo}", str(REPO_ROOT))
        result[match.group(1)] = value.replace("{data}", str(spark_data_dir()))
        logical, first_lineno = "", 0
    if logical:
        raise ValueError(f"{path}:{first_lineno}: continuation runs past the end of the file")
    return result


def delta_package() -> str:
    """The Maven coordinate delta's ``configure_spark_with_delta_pip`` would use.

    ``io.delta:delta-spark_<pyspark major.minor>_2.13:<installed delta-spark version>``. The
    repository's spark-defaults.conf pins the version instead when Maven Central lags PyPI.
    """
    return (
        f"io.delta:delta-spark_{_major_minor(pyspark.__version__)}_{SCALA_BINARY_VERSION}"
        f":{metadata.version('delta-spark')}"
    )


MASTER_URL_ENV = "SPARK_MASTER_URL"
"""A Spark master URL from the environment (docker-compose's job runner sets it); it replaces
the default `local[2]` but not what spark-submit or the caller chose."""


def launcher_settings() -> dict[str, str]:
    """The Spark settings the process was launched with: under spark-submit (the JVM exists
    before Python runs, and PYSPARK_GATEWAY_PORT names it) everything spark-submit put into the
    driver's configuration, `--master`, `--conf`, `--packages` and its installation's
    spark-defaults.conf included; in a plain Python process, nothing (no JVM is started
    here)."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return {}
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def build_session(
    app_name: str = "tessera",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    warehouse_dir: str | None = None,
    metastore_dir: str | None = None,
) -> SparkSession:
    """Build (or return the existing) SparkSession with Delta and Tessera's defaults.

    Layers, later ones winning: the built-in defaults; conf/spark-defaults.conf;
    ``$SPARK_MASTER_URL`` for the master; whatever spark-submit launched the process with
    (`launcher_settings`: our defaults never override it); ``conf``; then ``master``,
    ``warehouse_dir`` and ``metastore_dir`` (use Hive's catalog, its Derby database and log
    there). See the module docstring. The catalog is an in-memory one per session, which
    registers the warehouse's Delta tables by name as the session starts, unless a Hive
    metastore is configured (spark_jobs/catalog.py).

    Call it before the process makes its first gRPC call, as the jobs and the demo do: PySpark
    forks the JVM with ``preexec_fn``, and grpcio >= 1.80's fork handlers can kill that child
    once gRPC has been running (grpc/grpc#43055; seen as JAVA_GATEWAY_EXITED).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    file_defaults = read_spark_defaults()
    if any(str(spark_data_dir()) in v for v in file_defaults.values()):
        spark_data_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    settings = {**_BUILTIN_DEFAULTS, **file_defaults}
    if os.environ.get(MASTER_URL_ENV):
        settings["spark.master"] = os.environ[MASTER_URL_ENV]
    # What the launcher already set (spark-submit's --master and --conf, its installation's
    # spark-defaults.conf) wins over our small-machine defaults: drop ours for those keys.
    launched = launcher_settings()
    for key in launched:
        settings.pop(key, None)
    if launched and not _launched_with_delta(launched):
        # spark-submit without Delta's jars: a session that never touches Delta must still
        # start and run ("Cannot find catalog plugin class ... DeltaCatalog" on the first
        # query otherwise); one that needs it fails in `require_delta` naming the flags.
        for key in DELTA_SETTINGS:
            settings.pop(key, None)
    settings.update(conf or {})
    chosen = {**launched, **(conf or {})}
    if CATALOG_IMPLEMENTATION not in chosen and hive_requested(chosen):
        # The caller named a metastore (a network one, say) without choosing Hive's catalog:
        # that is a request for it, over our in-memory default.
        settings[CATALOG_IMPLEMENTATION] = "hive"
    if master is not None:
        settings["spark.master"] = master
    if warehouse_dir is not None:
        settings["spark.sql.warehouse.dir"] = str(Path(warehouse_dir).resolve())
    if metastore_dir is not None:
        _configure_metastore(settings, Path(metastore_dir).resolve())
    # Under spark-submit the JVM and its jars exist already (pass --packages there, README).
    delta_jar = (
        None if launched else _configure_delta_jars(settings, file_defaults.get(_PACKAGES, ""))
    )
    _configure_logging(settings)

    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        if not _java_found():
            raise SparkSessionError(
                "Spark did not start: no `java` on PATH and JAVA_HOME is unset; "
                "PySpark 4 needs Java 17 or 21 (Debian: apt-get install openjdk-17-jre-headless)"
            ) from exc
        if delta_jar is None or _ivy_has(settings, delta_jar):
            raise
        spark = _start_after_fetching(builder, settings, delta_jar, exc)
    # The log4j2 file already says WARN; this also covers a caller who replaced that file.
    spark.sparkContext.setLogLevel(LOG_LEVEL)
    from spark_jobs.datasource import register

    register(spark)  # format("tessera") and USING tessera
    if not launched or _launched_with_delta(launched):
        register_tables(spark)  # the warehouse's Delta tables by name (in-memory catalog only)
    return spark


DELTA_SETTINGS = ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
"""The two settings Delta's SQL support needs besides its jars."""
_DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def _launched_with_delta(launched: Mapping[str, str]) -> bool:
    """spark-submit put Delta's jars on the classpath (--packages or --jars)."""
    return any("delta-spark" in launched.get(key, "") for key in (_PACKAGES, _JARS, "spark.jars"))


def require_delta(spark: SparkSession, what: str) -> None:
    """Raise SparkSessionError, naming the spark-submit flags, if `spark` cannot read or write
    Delta tables (started by spark-submit without Delta's package). `what`: the job or step
    that needs it."""
    conf = spark.conf.get("spark.sql.catalog.spark_catalog", "") or ""
    jvm = getattr(getattr(spark, "sparkContext", None), "_jvm", None)
    loadable = True
    if jvm is not None:
        try:
            jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(_DELTA_CATALOG)
        except Exception:
            loadable = False
    if conf == _DELTA_CATALOG and loadable:
        return
    defaults = {**_BUILTIN_DEFAULTS, **read_spark_defaults()}
    flags = " ".join(
        [
            f"--packages {defaults.get(_PACKAGES) or delta_package()}",
            *(f"--conf {k}={defaults[k]}" for k in DELTA_SETTINGS),
        ]
    )
    raise SparkSessionError(
        f"{what} reads and writes Delta tables, and this Spark session was started without "
        f"Delta: run it with `tessera spark submit` (which adds it), or give spark-submit "
        f"{flags}"
    )


def _configure_metastore(settings: dict[str, str], directory: Path) -> None:
    """Use Hive's catalog with its Derby database, and Derby's log, under `directory`. Derby
    admits one JVM at a time: this is for a process that wants its catalog to itself (a
    test, the demo, a Connect server); jobs that run concurrently share the default, or a
    network metastore (spark_jobs/catalog.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    settings["spark.sql.catalogImplementation"] = "hive"
    settings["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
        f"jdbc:derby:;databaseName={directory / 'metastore_db'};create=true"
    )
    options = [
        o
        for o in settings.get(_DRIVER_JAVA_OPTIONS, "").split()
        if not o.startswith(("-Dderby.system.home=", "-Dderby.stream.error.file="))
    ]
    options += [
        f"-Dderby.system.home={directory}",
        f"-Dderby.stream.error.file={directory}/derby.log",
    ]
    settings[_DRIVER_JAVA_OPTIONS] = " ".join(options)


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _configure_delta_jars(settings: dict[str, str], file_packages: str) -> str | None:
    """Put the Delta jars into ``settings``; return the Ivy coordinate, or None for local jars.

    The Delta artifact comes from ``settings`` (the caller's conf may name other packages only),
    else from the defaults file's ``spark.jars.packages``, else from :func:`delta_package`.
    """
    packages = _split(settings.get(_PACKAGES, ""))
    delta = [p for p in packages if p.startswith(_DELTA_PREFIX)]
    others = [p for p in packages if p not in delta]
    if not delta:
        delta = [p for p in _split(file_packages) if p.startswith(_DELTA_PREFIX)]

    local_jars = sorted(JARS_DIR.glob("*.jar")) if JARS_DIR.is_dir() else []
    if any("delta-spark_" in j.name for j in local_jars):
        # Offline fallback: jars copied into jars/ by hand (e.g. from another machine's Ivy
        # cache, where they are named io.delta_delta-spark_...) or by mvn dependency:copy.
        existing = [j for j in settings.get(_JARS, "").split(",") if j]
        settings[_JARS] = ",".join(existing + [str(j) for j in local_jars])
        if others:
            settings[_PACKAGES] = ",".join(others)
        else:
            settings.pop(_PACKAGES, None)
        return None

    if not delta:
        delta = [delta_package()]
    if len(delta) > 1:
        raise SparkSessionError(f"{_PACKAGES} names more than one Delta artifact: {delta}")
    _check_delta_coordinate(delta[0])
    settings[_PACKAGES] = ",".join(delta + others)
    return delta[0]


def _split(packages: str) -> list[str]:
    return [p.strip() for p in packages.split(",") if p.strip()]


def _check_delta_coordinate(coordinate: str) -> None:
    """Fail fast, before a JVM starts, when the pinned Delta jars cannot match this venv."""
    match = _DELTA_ARTIFACT.match(coordinate)
    if match is None:
        raise SparkSessionError(
            f"cannot parse Delta coordinate {coordinate!r}: expected "
            f"io.delta:delta-spark_<spark major.minor>_<scala>:<version>"
        )
    spark_mm, scala, major, minor = match.groups()
    problems = []
    if spark_mm != _major_minor(pyspark.__version__):
        problems.append(f"built for Spark {spark_mm}, but pyspark is {pyspark.__version__}")
    if scala != SCALA_BINARY_VERSION:
        problems.append(f"built for Scala {scala}, but Spark 4 uses {SCALA_BINARY_VERSION}")
    python_delta = metadata.version("delta-spark")
    if f"{major}.{minor}" != _major_minor(python_delta):
        problems.append(f"Delta {major}.{minor}, but the delta-spark package is {python_delta}")
    if problems:
        raise SparkSessionError(
            f"Delta jars {coordinate} do not match this environment ({'; '.join(problems)}). "
            f"Fix {_PACKAGES} in {DEFAULTS_FILE} or in the conf given to build_session() "
            f"(with no Delta artifact named there, build_session() uses {delta_package()})."
        )


def _configure_logging(settings: dict[str, str]) -> None:
    """Point the driver JVM at conf/log4j2.properties unless the caller chose a configuration."""
    options = settings.get(_DRIVER_JAVA_OPTIONS, "")
    if LOG4J2_FILE.is_file() and "log4j2.configurationFile" not in options:
        # A URI, so that a path with spaces survives Spark's splitting of the option string.
        option = f"-Dlog4j2.configurationFile={LOG4J2_FILE.as_uri()}"
        settings[_DRIVER_JAVA_OPTIONS] = f"{options} {option}".strip()


def _start_after_fetching(
    builder: SparkSession.Builder, settings: Mapping[str, str], coordinate: str, first: Exception
) -> SparkSession:
    """The JVM did not start and the Delta jars are not in the Ivy cache: the first download
    failed. Seen once in CI on a fresh machine under load, and gone on the next try, so try
    again; if that fails too and Maven is installed, fetch the jars into ~/.m2 with
    `mvn dependency:get` (Spark's Ivy looks there before the network) and try a last time."""
    print(
        f"tessera: Spark did not start and {coordinate} is not in the Ivy cache; "
        "trying the download again",
        file=sys.stderr,
    )
    try:
        return builder.getOrCreate()
    except Exception:
        if _ivy_has(settings, coordinate) or not _maven_get(coordinate):
            raise SparkSessionError(_ivy_failure_message(settings, coordinate)) from first
    try:
        return builder.getOrCreate()
    except Exception as exc:
        raise SparkSessionError(_ivy_failure_message(settings, coordinate)) from exc


def _maven_get(coordinate: str) -> bool:
    """`mvn dependency:get` of `coordinate` and its dependencies into ~/.m2; whether it
    succeeded (False without Maven)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        return False
    print(f"tessera: fetching {coordinate} with Maven into ~/.m2", file=sys.stderr)
    try:
        done = subprocess.run(
            [mvn, "-q", "-B", "dependency:get", f"-Dartifact={coordinate}"],
            timeout=900,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _java_found() -> bool:
    return bool(os.environ.get("JAVA_HOME")) or shutil.which("java") is not None


def _ivy_dir(settings: Mapping[str, str]) -> Path:
    configured = settings.get(_IVY)
    return Path(configured).expanduser() if configured else DEFAULT_IVY_DIR


def _ivy_has(settings: Mapping[str, str], coordinate: str) -> bool:
    """Whether spark-submit already retrieved ``coordinate`` into the Ivy jars directory."""
    group, artifact, version = coordinate.split(":")
    return (_ivy_dir(settings) / "jars" / f"{group}_{artifact}-{version}.jar").is_file()


def _ivy_failure_message(settings: Mapping[str, str], coordinate: str) -> str:
    ivy = _ivy_dir(settings)
    return (
        f"Spark did not start, and the Delta jars ({coordinate}) are not in the Ivy cache "
        f"{ivy}/jars, so Ivy most likely could not download them from Maven Central: look above "
        f"for 'UNRESOLVED DEPENDENCIES' and 'Server access error'. Either\n"
        f"  - let this machine reach https://repo1.maven.org/maven2/ (behind a proxy: add "
        f"-Dhttps.proxyHost=... -Dhttps.proxyPort=... to {_DRIVER_JAVA_OPTIONS}; for a mirror: "
        f"spark.jars.repositories or spark.jars.ivySettings), or\n"
        f"  - if Maven on this machine can reach a repository (e.g. a mirror in "
        f"~/.m2/settings.xml), run `mvn dependency:get -Dartifact={coordinate}`: Spark's Ivy "
        f"looks in ~/.m2/repository before the network, or\n"
        f"  - copy delta-spark, delta-storage, the delta-kernel and unitycatalog jars into "
        f"{JARS_DIR}/ (from another machine's {ivy}/jars); build_session() then loads them "
        f"with spark.jars and skips Ivy.\n"
        f"The first successful run fills {ivy}; later runs need no network."
    )
