"""docker-compose.yml and the Dockerfile, checked without a Docker engine (none runs here).

`check_compose` reads the compose file the way the containers will run it: every command must
be a real entry point (a `tessera` command the CLI parser accepts, a `python -m` module with
`main`, a `python -c` snippet that compiles, Spark's spark-class from the installed pyspark with
a class its jars hold), every `--conf` must reach a file in conf/ through a bind mount, every
`--set` must name a real setting and the resulting config must validate, addresses must name
services and the ports they bind, data must live on declared named volumes, health checks and
`depends_on` must fit, each service must mount only its own identity from the `pki` volume,
read-only (docs/design/security.md#R14), and status pages off loopback must say
`http_auth=tls` (docs/design/security.md#R13). It returns the problems rather than asserting,
so the mutation tests below can show that each kind of mistake is caught. The layout tests then
run the `pki` service's command into a temporary directory and look inside what every service
mounts: the CA's key only in the masters'.

The last test (slow: `make test-slow`) runs the compose file's own commands on loopback (the
`pki` service first; host names, ports and mounted paths rewritten, nothing else): the servers
come up, their health checks pass, and the job runner's command reports a healthy cluster. The
health check and the job runner's command are also run against a local cluster in
tests/tools/test_local_cluster.py, in the default run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
import yaml

from service.common.config import (
    ConfigError,
    MasterConfig,
    TServerConfig,
    load_config,
    parse_override,
    split_host_port,
)
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER
from service.tools.cli import build_parser
from service.tools.launcher import free_ports, terminate_all

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_SITE_PACKAGES = "/usr/local/lib/python3.11/site-packages"
"""Where `pip install .` puts packages in the python:3.11 image (Dockerfile: SPARK_HOME)."""
LOCAL_SITE_PACKAGES = Path(pyspark.__file__).resolve().parent.parent
CONFIG_CLASSES: dict[str, type[MasterConfig] | type[TServerConfig]] = {
    "master": MasterConfig,
    "tserver": TServerConfig,
}


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@dataclass
class Server:
    """A Tessera server service, as its command configures it."""

    service: str
    kind: str
    config: MasterConfig | TServerConfig

    @property
    def bind_port(self) -> int:
        return split_host_port(self.config.rpc_bind)[1]

    @property
    def ports(self) -> set[int]:
        """Every port the server listens on in its container (RPC, and HTTP when it has it)."""
        out = {self.bind_port}
        http = getattr(self.config, "http_bind", "")
        if http:
            out.add(split_host_port(http)[1])
        return out


HTTP_BIND = "http_bind" in {f.name for f in dataclasses.fields(MasterConfig)}


# --- the checker -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """One entry of a service's `volumes:`, short ("src:dst[:ro]") or long syntax."""

    source: str
    target: str
    read_only: bool = False
    subpath: str = ""
    """For a named volume: the directory inside it that is mounted ("" = the whole volume)."""

    @property
    def is_bind(self) -> bool:
        return self.source.startswith((".", "/"))


def _mount(v: Any) -> Mount:
    if isinstance(v, dict):
        return Mount(
            str(v.get("source", "")),
            str(v.get("target", "")),
            bool(v.get("read_only", False)),
            str((v.get("volume") or {}).get("subpath", "")),
        )
    parts = str(v).split(":")
    return Mount(parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2:3] == ["ro"])


def _mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m.source, m.target) for m in _mount_list(svc)]


def _mount_list(svc: dict[str, Any]) -> list[Mount]:
    return [_mount(v) for v in svc.get("volumes") or []]


def _under(path: str, mount: Mount) -> bool:
    return (path + "/").startswith(mount.target.rstrip("/") + "/")


def _host_path(svc: dict[str, Any], container_path: str) -> Path | None:
    """The file in the repository a bind mount shows at `container_path`, if any."""
    for m in _mount_list(svc):
        if m.is_bind and _under(container_path, m):
            rel = container_path[len(m.target.rstrip("/")) :].lstrip("/")
            return (ROOT / m.source / rel).resolve()
    return None


PKI_VOLUME = "pki"
"""The named volume `tessera security provision` fills: pki/ca is the CA, pki/<name> a party."""
CA_DIR = "ca"


def _is_provisioner(svc: dict[str, Any]) -> bool:
    return [str(c) for c in (svc.get("command") or [])[:3]] == ["tessera", "security", "provision"]


def _check_identities(name: str, svc: dict[str, Any], server: Server | None) -> list[str]:
    """Each service mounts only its own identity from the pki volume, read-only; the CA's own
    directory (and the whole volume) only the provisioner (docs/design/security.md#R14)."""
    problems: list[str] = []
    pki = [m for m in _mount_list(svc) if m.source == PKI_VOLUME]
    if _is_provisioner(svc):
        return problems
    for m in pki:
        if not m.subpath:
            problems.append(
                f"{name}: mounts the whole {PKI_VOLUME} volume at {m.target}, with the CA's key"
                " and every party's: mount its own directory only (volume subpath)"
            )
        elif m.subpath.split("/")[0] == CA_DIR:
            problems.append(f"{name}: mounts the CA's own directory {PKI_VOLUME}/{m.subpath}")
        if not m.read_only:
            problems.append(f"{name}: mounts {PKI_VOLUME}/{m.subpath} writable, not read-only")
    if server is not None:
        own = [m for m in pki if m.subpath == name]
        if len(pki) != 1 or not own:
            found = [m.subpath or "(whole volume)" for m in pki]
            problems.append(
                f"{name}: should mount exactly its own identity {PKI_VOLUME}/{name}, mounts {found}"
            )
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(server.config.security, key)
            if own and not _under(path, own[0]):
                problems.append(f"{name}: security.{key} {path!r} is not in its own identity")
    else:
        servers = {"master", "tserver"}
        for m in pki:
            if m.subpath.split("-")[0] in servers:
                problems.append(f"{name}: mounts a server's identity {PKI_VOLUME}/{m.subpath}")
    return problems


def _check_status_auth(name: str, server: Server) -> list[str]:
    """Status pages bound beyond loopback require client certificates, and the file says so
    rather than relying on the default (docs/design/security.md#R13)."""
    bind = getattr(server.config, "http_bind", "")
    auth = getattr(server.config, "http_auth", None)
    if not bind or auth is None:
        return []
    if auth != "tls":
        return [f"{name}: http_auth is {auth!r}; the compose file sets http_auth=tls"]
    return []


def _parse(parser: Any, args: list[str]) -> tuple[Any, str | None]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(args), None
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1] if err.getvalue() else "bad args"


def _class_in_jars(name: str) -> bool:
    entry = name.replace(".", "/") + ".class"
    for jar in (LOCAL_SITE_PACKAGES / "pyspark" / "jars").glob("spark-core_*.jar"):
        with zipfile.ZipFile(jar) as z:
            if entry in z.namelist():
                return True
    return False


def check_command(where: str, cmd: list[str]) -> tuple[list[str], Any]:
    """Problems with one exec-form command, and the parsed args of a `tessera` or `python -m`
    command (None otherwise)."""
    if not cmd or not all(isinstance(c, str) for c in cmd):
        return [f"{where}: expected a list of strings, got {cmd!r}"], None
    if cmd[0] == "tessera":
        args, err = _parse(build_parser(), cmd[1:])
        return (
            [f"{where}: `{shlex.join(cmd)}` is not a tessera command: {err}"] if err else []
        ), args
    if cmd[0] == "python" and cmd[1:2] == ["-m"] and len(cmd) > 2:
        try:
            module = importlib.import_module(cmd[2])
        except ImportError as e:
            return [f"{where}: module {cmd[2]} does not import: {e}"], None
        if not callable(getattr(module, "main", None)):
            return [f"{where}: module {cmd[2]} has no main()"], None
        if callable(getattr(module, "build_parser", None)):
            args, err = _parse(module.build_parser(), cmd[3:])
            return ([f"{where}: {cmd[2]} refuses {cmd[3:]}: {err}"] if err else []), args
        return [], None
    if cmd[0] == "python" and cmd[1:2] == ["-c"] and len(cmd) == 3:
        try:
            compile(cmd[2], where, "exec")
        except SyntaxError as e:
            return [f"{where}: python -c does not compile: {e}"], None
        return [], None
    if cmd[0].startswith(IMAGE_SITE_PACKAGES + "/"):
        local = LOCAL_SITE_PACKAGES / cmd[0][len(IMAGE_SITE_PACKAGES) + 1 :]
        if not local.is_file():
            return [f"{where}: {cmd[0]} is not in the installed packages ({local})"], None
        if local.name == "spark-class" and (len(cmd) < 2 or not _class_in_jars(cmd[1])):
            return [f"{where}: spark-class needs a class Spark's jars hold, got {cmd[1:2]}"], None
        return [], None
    return [f"{where}: unknown program {cmd[0]!r}"], None


def _check_server(name: str, svc: dict[str, Any], args: Any, named: set[str]) -> Any:
    problems: list[str] = []
    host_conf = _host_path(svc, args.conf)
    if host_conf is None:
        return [f"{name}: --conf {args.conf} is not under a bind-mounted directory"], None
    if not host_conf.is_file():
        return [f"{name}: --conf {args.conf} maps to {host_conf}, which does not exist"], None
    try:
        overrides = dict(parse_override(s) for s in args.set)
        config = load_config(CONFIG_CLASSES[args.command], host_conf, overrides)
    except ConfigError as e:
        return [f"{name}: {e.message}"], None
    data_dir = str(config.data_dir)
    if not any(src in named and data_dir.startswith(dst + "/") for src, dst in _mounts(svc)):
        problems.append(f"{name}: data_dir {data_dir} is not on a named volume")
    if not config.rpc_bind.startswith("0.0.0.0:"):
        problems.append(f"{name}: rpc_bind {config.rpc_bind} is unreachable from other containers")
    if config.security.mode != "secure":
        problems.append(f"{name}: security.mode is {config.security.mode!r}, not 'secure'")
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(config.security, key)
        if not any(src in named and path.startswith(dst + "/") for src, dst in _mounts(svc)):
            problems.append(f"{name}: security.{key} {path!r} is not on a named volume")
    server = Server(name, args.command, config)
    problems += _check_status_auth(name, server)
    return problems, server


def _check_addresses(services: dict[str, Any], servers: dict[str, Server]) -> list[str]:
    problems: list[str] = []
    masters = [s for s in servers.values() if s.kind == "master"]
    expected = sorted(f"{m.service}:{m.bind_port}" for m in masters)
    if not masters:
        problems.append("no master service")
    for s in servers.values():
        adv = s.config.advertised_address
        if adv != f"{s.service}:{s.bind_port}":
            problems.append(
                f"{s.service}: advertised_address {adv!r} should be {s.service}:{s.bind_port}"
                " (its service name and the port it binds)"
            )
        if sorted(s.config.master_addresses) != expected:
            problems.append(
                f"{s.service}: master_addresses {list(s.config.master_addresses)} should be"
                f" exactly the masters {expected}"
            )
    for name, svc in services.items():
        cmd = [str(c) for c in svc.get("command") or []]
        env = svc.get("environment") or {}
        lists = [cmd[i + 1] for i, c in enumerate(cmd[:-1]) if c == "--masters"]
        lists += [str(env[k]) for k in env if k == "TESSERA_MASTERS"]
        for text in lists:
            if sorted(text.split(",")) != expected:
                problems.append(f"{name}: masters {text} should be exactly {expected}")
        tservers = sum(s.kind == "tserver" for s in servers.values())
        for i, c in enumerate(cmd[:-1]):
            if c == "--tservers" and cmd[i + 1] != str(tservers):
                problems.append(f"{name}: --tservers {cmd[i + 1]}, the file runs {tservers}")
        spark_urls = [c for c in cmd if c.startswith("spark://")]
        spark_urls += [str(v) for v in env.values() if str(v).startswith("spark://")]
        for url in spark_urls:
            host, port = split_host_port(url.removeprefix("spark://"))
            target = [str(c) for c in (services.get(host) or {}).get("command") or []]
            if "--port" not in target or target[target.index("--port") + 1] != str(port):
                problems.append(f"{name}: {url} names no Spark master service on that port")
    return problems


def _check_published(name: str, svc: dict[str, Any], server: Server | None) -> list[str]:
    """Every published container port is one the service listens on."""
    problems = []
    cmd = [str(c) for c in svc.get("command") or []]
    listens = server.ports if server is not None else set()
    for flag in ("--webui-port", "--port"):
        if flag in cmd:
            listens.add(int(cmd[cmd.index(flag) + 1]))
    for spec in svc.get("ports") or []:
        container = int(str(spec).rsplit(":", 1)[-1].split("/")[0])
        if container not in listens:
            problems.append(f"{name}: publishes port {container}, but listens on {sorted(listens)}")
        if not str(spec).startswith("127.0.0.1:"):
            problems.append(
                f"{name}: publishes {spec} on every host address; status pages and UIs are "
                "published on the host's loopback only (127.0.0.1:HOST:CONTAINER)"
            )
    return problems


def _check_health(name: str, svc: dict[str, Any], server: Server | None) -> list[str]:
    hc = svc.get("healthcheck")
    if hc is None:
        # One-shot services (the job runner, the pki provisioner) run and exit: nothing to probe.
        return [] if svc.get("restart") == "no" else [f"{name}: no healthcheck"]
    test = hc.get("test") or []
    if test[:1] != ["CMD"]:
        return [f"{name}: healthcheck should be exec form [CMD, ...], got {test[:1]}"]
    problems, args = check_command(f"{name} healthcheck", test[1:])
    if args is not None and hasattr(args, "kind"):
        if server is None or args.kind != server.kind:
            problems.append(f"{name}: healthcheck --kind {args.kind} does not fit this service")
        elif args.address != f"127.0.0.1:{server.bind_port}":
            problems.append(
                f"{name}: healthcheck asks {args.address}, the server binds {server.bind_port}"
            )
        if server is not None:
            own = Path(server.config.security.ca_file).parent
            if getattr(args, "credentials", None) != str(own):
                problems.append(
                    f"{name}: healthcheck presents {args.credentials}, not the server's own"
                    f" credentials {own}"
                )
    return problems


def check_compose(compose: dict[str, Any]) -> list[str]:
    """Every problem in `compose` (a loaded docker-compose.yml); [] when it is consistent."""
    problems: list[str] = []
    services: dict[str, Any] = compose.get("services") or {}
    named = set(compose.get("volumes") or {})
    servers: dict[str, Server] = {}
    for name, svc in services.items():
        if svc.get("image") != "tessera:dev" or svc.get("build") != ".":
            problems.append(f"{name}: should run image tessera:dev built from .")
        for src, dst in _mounts(svc):
            if not src.startswith((".", "/")) and src not in named:
                problems.append(f"{name}: volume {src} (at {dst}) is not declared under volumes:")
            if src.startswith(".") and not (ROOT / src).exists():
                problems.append(f"{name}: bind mount {src} does not exist in the repository")
        cmd_problems, args = check_command(name, svc.get("command") or [])
        problems += cmd_problems
        server = None
        if args is not None and getattr(args, "command", None) in CONFIG_CLASSES:
            server_problems, server = _check_server(name, svc, args, named)
            problems += server_problems
            if server is not None:
                servers[name] = server
        problems += _check_health(name, svc, server)
        problems += _check_published(name, svc, server)
        problems += _check_identities(name, svc, server)
        for dep, spec in (svc.get("depends_on") or {}).items():
            if dep not in services:
                problems.append(f"{name}: depends_on unknown service {dep}")
            elif spec.get("condition") == "service_healthy" and "healthcheck" not in services[dep]:
                problems.append(f"{name}: waits for {dep} to be healthy, which has no healthcheck")
    problems += _check_addresses(services, servers)
    return problems


def check_dockerfile(text: str) -> list[str]:
    problems = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] != ["COPY"] or any(w.startswith("--from") for w in words):
            continue
        for src in [w for w in words[1:-1] if not w.startswith("--")]:
            if not (ROOT / src).exists():
                problems.append(f"Dockerfile: COPY source {src} does not exist")
    if f"SPARK_HOME={IMAGE_SITE_PACKAGES}/pyspark" not in text:
        problems.append(f"Dockerfile: SPARK_HOME should be {IMAGE_SITE_PACKAGES}/pyspark")
    if not re.search(r"^FROM python:3\.11-", text, re.M):
        problems.append("Dockerfile: the base image should be python:3.11 (site-packages path)")
    return problems


# --- the file as it is -----------------------------------------------------------------------


def test_compose_file_is_consistent() -> None:
    compose = load_compose()
    assert check_compose(compose) == []
    services = compose["services"]
    assert {f"master-{i}" for i in (1, 2, 3)} <= set(services)
    assert {f"tserver-{i}" for i in (1, 2, 3)} <= set(services)
    assert {"spark-master", "spark-worker", "job-runner"} <= set(services)
    assert services["job-runner"]["profiles"] == ["jobs"]


def test_dockerfile_copy_sources_exist() -> None:
    assert check_dockerfile(DOCKERFILE.read_text()) == []


def test_dockerfile_checker_catches_a_missing_copy_source() -> None:
    text = DOCKERFILE.read_text().replace("COPY spark_jobs", "COPY spark_jobz")
    assert any("spark_jobz" in p for p in check_dockerfile(text))


# --- mutations: each kind of mistake is caught ------------------------------------------------


def _set(service: str, old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def mutate(c: dict[str, Any]) -> None:
        cmd = c["services"][service]["command"]
        assert old in cmd, (old, cmd)
        cmd[cmd.index(old)] = new

    return mutate


def _drop_volume(c: dict[str, Any]) -> None:
    del c["volumes"]["master-1-data"]


def _health_kind(c: dict[str, Any]) -> None:
    test = c["services"]["master-2"]["healthcheck"]["test"]
    test[test.index("master")] = "tserver"


def _health_port(c: dict[str, Any]) -> None:
    test = c["services"]["tserver-2"]["healthcheck"]["test"]
    test[test.index("127.0.0.1:7050")] = "127.0.0.1:7051"


def _depends_unknown(c: dict[str, Any]) -> None:
    c["services"]["tserver-1"]["depends_on"]["master-4"] = {"condition": "service_healthy"}


def _runner_tservers(c: dict[str, Any]) -> None:
    del c["services"]["tserver-3"]
    for svc in c["services"].values():
        (svc.get("depends_on") or {}).pop("tserver-3", None)


def _publish_wrong_port(c: dict[str, Any]) -> None:
    c["services"]["master-2"]["ports"] = ["127.0.0.1:8052:8052"]


def _publish_everywhere(c: dict[str, Any]) -> None:
    c["services"]["tserver-1"]["ports"] = ["8061:8050"]


def _runner_masters(c: dict[str, Any]) -> None:
    c["services"]["job-runner"]["environment"]["TESSERA_MASTERS"] = "master-1:7051"


def _insecure_master(c: dict[str, Any]) -> None:
    _set(
        "master-3", "security.key_file=/var/lib/tessera-identity/key.pem", "security.mode=insecure"
    )(c)
    _set("master-3", "http_auth=tls", "http_auth=none")(c)


def _whole_pki_in_tserver(c: dict[str, Any]) -> None:
    c["services"]["tserver-1"]["volumes"].append("pki:/var/lib/tessera-pki:ro")


def _other_identity(c: dict[str, Any]) -> None:
    for v in c["services"]["tserver-2"]["volumes"]:
        if isinstance(v, dict) and v.get("source") == PKI_VOLUME:
            v["volume"]["subpath"] = "master-2"


def _ca_dir_in_runner(c: dict[str, Any]) -> None:
    for v in c["services"]["job-runner"]["volumes"]:
        if isinstance(v, dict) and v.get("source") == PKI_VOLUME:
            v["volume"]["subpath"] = "ca"


def _writable_identity(c: dict[str, Any]) -> None:
    for v in c["services"]["master-1"]["volumes"]:
        if isinstance(v, dict) and v.get("source") == PKI_VOLUME:
            v["read_only"] = False


def _health_as_admin(c: dict[str, Any]) -> None:
    test = c["services"]["tserver-3"]["healthcheck"]["test"]
    test[test.index("/var/lib/tessera-identity")] = "/var/lib/tessera-admin"


MASTERS = 'master_addresses=["master-1:7051", "master-2:7051", "master-3:7051"]'
MUTATIONS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("bad --set key", _set("master-2", "rpc_bind=0.0.0.0:7051", "rpc_bnd=0.0.0.0:7051"), "rpc_bnd"),
    ("bad --set value", _set("tserver-1", "rpc_bind=0.0.0.0:7050", "rpc_bind=7050"), "rpc_bind"),
    (
        "wrong advertised port",
        _set("tserver-1", "advertised_address=tserver-1:7050", "advertised_address=tserver-1:7051"),
        "tserver-1: advertised_address",
    ),
    (
        "advertised name of another service",
        _set("master-3", "advertised_address=master-3:7051", "advertised_address=master-1:7051"),
        "master-3: advertised_address",
    ),
    (
        "a tablet server missing a master",
        _set("tserver-3", MASTERS, 'master_addresses=["master-1:7051", "master-2:7051"]'),
        "tserver-3: master_addresses",
    ),
    (
        "missing conf",
        _set("master-1", "/etc/tessera/master.toml", "/etc/tessera/nope.toml"),
        "nope.toml",
    ),
    ("conf outside a mount", _set("master-1", "/etc/tessera/master.toml", "/x.toml"), "/x.toml"),
    ("unknown tessera command", _set("master-1", "master", "mastr"), "not a tessera command"),
    ("undeclared volume", _drop_volume, "master-1-data"),
    ("healthcheck of the wrong kind", _health_kind, "master-2: healthcheck --kind"),
    ("healthcheck on the wrong port", _health_port, "tserver-2: healthcheck asks"),
    ("depends_on an unknown service", _depends_unknown, "master-4"),
    ("job runner with one master", _runner_masters, "job-runner: masters"),
    ("job runner expecting a tablet server too many", _runner_tservers, "--tservers 3"),
    ("published port nothing listens on", _publish_wrong_port, "master-2: publishes port 8052"),
    ("port published on every address", _publish_everywhere, "tserver-1: publishes 8061:8050"),
    ("a master run insecure", _insecure_master, "master-3: security.mode is 'insecure'"),
    (
        "a key file off the pki volume",
        _set(
            "tserver-2",
            "security.key_file=/var/lib/tessera-identity/key.pem",
            "security.key_file=/tmp/key.pem",
        ),
        "tserver-2: security.key_file '/tmp/key.pem' is not on a named volume",
    ),
    (
        "status pages open beyond loopback",
        _set("tserver-1", "http_auth=tls", "http_auth=none"),
        "tserver-1: http_auth is 'none'",
    ),
    (
        "the default instead of a stated http_auth",
        _set("master-2", "http_auth=tls", "log_level=INFO"),
        "master-2: http_auth is 'auto'",
    ),
    (
        "the whole pki volume in a tablet server",
        _whole_pki_in_tserver,
        "tserver-1: mounts the whole pki volume",
    ),
    (
        "a tablet server given a master's identity",
        _other_identity,
        "tserver-2: should mount exactly its own identity pki/tserver-2",
    ),
    ("the CA's directory in the job runner", _ca_dir_in_runner, "job-runner: mounts the CA's"),
    ("an identity mounted writable", _writable_identity, "master-1: mounts pki/master-1 writable"),
    (
        "a health check with someone else's credentials",
        _health_as_admin,
        "tserver-3: healthcheck presents /var/lib/tessera-admin",
    ),
    (
        "unknown module",
        _set("job-runner", "service.tools.cluster_cmd", "service.tools.nope"),
        "does not import",
    ),
    (
        "spark class that does not exist",
        _set("spark-master", "org.apache.spark.deploy.master.Master", "org.example.Master"),
        "spark-class needs a class",
    ),
    (
        "spark worker pointed at the wrong port",
        _set("spark-worker", "spark://spark-master:7077", "spark://spark-master:7078"),
        "spark://spark-master:7078",
    ),
]


@pytest.mark.parametrize(("what", "mutate", "expected"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_checker_catches(
    what: str, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    compose = copy.deepcopy(load_compose())
    mutate(compose)
    problems = check_compose(compose)
    assert any(expected in p for p in problems), (what, problems)


# --- the identities each service is given ----------------------------------------------------


def _host_paths(svc: dict[str, Any], volumes: Path) -> list[tuple[str, Path]]:
    """(container path, path on this machine) of each of `svc`'s mounts, longest container path
    first: a named volume is `volumes/<name>[/<subpath>]`, a bind mount the repository's."""
    out = []
    for m in _mount_list(svc):
        host = (ROOT / m.source).resolve() if m.is_bind else volumes / m.source / m.subpath
        out.append((m.target.rstrip("/"), host))
    return sorted(out, key=lambda t: -len(t[0]))


def _in_container(arg: str, mounts: list[tuple[str, Path]]) -> str:
    for target, host in mounts:
        arg = re.sub(re.escape(target) + r"(?=/|$)", str(host).replace("\\", "\\\\"), arg)
    return arg


def _provision(
    tmp_path: Path, ports: dict[str, tuple[int, int]] | None = None
) -> tuple[dict[str, Any], Path]:
    """Run the compose file's `pki` service command here, its volume a directory of tmp_path:
    (the services, the directory standing for the named volumes). With `ports` (`_localize`)
    the masters' certificates bind their loopback addresses, each still in its service's
    directory."""
    services = load_compose()["services"]
    volumes = tmp_path / "volumes"
    name = next(n for n, s in services.items() if _is_provisioner(s))
    command = [str(c) for c in services[name]["command"]]
    if ports:
        command = [
            f"{c.split(':')[0]}={c}" if i and command[i - 1] == "--master" else c
            for i, c in enumerate(command)
        ]
    cmd = _localize(command, name, ports or {}, _host_paths(services[name], volumes))
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    return services, volumes


def _ca_keys_given(svc: dict[str, Any], volumes: Path) -> list[Path]:
    """Every CA key inside what `svc` mounts, or a mount that is one."""
    found: list[Path] = []
    for _, host in _host_paths(svc, volumes):
        if host.is_file():
            found += [host] if host.name == "ca.key" else []
        elif host.is_dir():
            found += sorted(host.rglob("ca.key"))
    return found


def _kind(svc: dict[str, Any]) -> str:
    cmd = [str(c) for c in svc.get("command") or []]
    return cmd[1] if cmd[:1] == ["tessera"] and len(cmd) > 1 else ""


def test_provisioned_layout_gives_the_ca_key_to_masters_only(tmp_path: Path) -> None:
    """docs/design/security.md#R14, on the files themselves: provision as the `pki` service
    does, then look inside what every other service mounts."""
    services, volumes = _provision(tmp_path)
    pki = volumes / PKI_VOLUME
    assert (pki / CA_DIR / "ca.key").is_file()  # the key exists: finding none below means something
    tservers = [n for n, s in services.items() if _kind(s) == "tserver"]
    masters = [n for n, s in services.items() if _kind(s) == "master"]
    assert len(tservers) == 3 and len(masters) == 3
    for name, svc in services.items():
        if _is_provisioner(svc):
            continue
        keys = _ca_keys_given(svc, volumes)
        if name in masters:
            assert keys == [pki / name / "ca.key"], (name, keys)
        else:
            assert keys == [], (name, keys)
    for name in tservers:
        assert sorted(p.name for p in (pki / name).iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    # Owner-only throughout: directories 0700, files 0600.
    for path in [pki, *pki.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_the_layout_check_finds_a_ca_key_mounted_into_a_tablet_server(tmp_path: Path) -> None:
    services, volumes = _provision(tmp_path)
    svc = copy.deepcopy(services["tserver-1"])
    svc["volumes"].append("pki:/var/lib/tessera-pki:ro")  # the layout before R14
    assert _ca_keys_given(svc, volumes) == sorted((volumes / PKI_VOLUME).rglob("ca.key")), (
        "the whole volume shows every CA key"
    )


# --- the compose commands, run for real on loopback -------------------------------------------


def _localize(
    cmd: list[str],
    service: str,
    ports: dict[str, tuple[int, int]],
    mounts: list[tuple[str, Path]],
) -> list[str]:
    """`cmd` as it would run in `service`'s container, rewritten for loopback: each service's
    name:port becomes 127.0.0.1:<its local port>, this service's binds and health check use its
    local port, and each path in one of its mounts (`_host_paths`) the directory standing for
    it: its own data volume, its own identity, the repository's conf/."""
    out = []
    for arg in cmd:
        for name, (container_port, local_port) in ports.items():
            arg = arg.replace(f"{name}:{container_port}", f"127.0.0.1:{local_port}")
        if service in ports:
            container_port, local_port = ports[service]
            for host in ("0.0.0.0", "127.0.0.1"):
                arg = arg.replace(f"{host}:{container_port}", f"127.0.0.1:{local_port}")
        out.append(_in_container(arg, mounts))
    if out[0] == "tessera":
        out[:1] = [sys.executable, "-m", "service.tools.cli"]
    elif out[0] == "python":
        out[0] = sys.executable
    return out


def _until_ok(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,
            env={**os.environ, **(env or {})},
        )
        if done.returncode == 0 or time.monotonic() > deadline:
            return done
        time.sleep(0.3)


@pytest.mark.integration
@pytest.mark.slow  # a second 3+3 start (tests/tools has the default-run one): `make test-slow`
def test_compose_commands_serve_on_loopback(tmp_path: Path) -> None:
    services = load_compose()["services"]
    servers = [n for n, s in services.items() if _kind(s) in CONFIG_CLASSES]
    ports: dict[str, tuple[int, int]] = {}
    for name, local in zip(servers, free_ports(len(servers)), strict=True):
        bind = next(c for c in services[name]["command"] if c.startswith("rpc_bind="))
        ports[name] = (int(bind.rsplit(":", 1)[1]), local)
    services, volumes = _provision(tmp_path, ports)  # the `pki` service, first

    def here(name: str, cmd: list[str]) -> list[str]:
        return _localize(cmd, name, ports, _host_paths(services[name], volumes))

    procs = []
    try:
        for name in servers:
            cmd = here(name, services[name]["command"])
            timing = FAST_RAFT if services[name]["command"][1] == "master" else FAST_TSERVER
            cmd += [x for k, v in timing.items() for x in ("--set", f"{k}={v}")]
            if HTTP_BIND:  # several servers share this machine: any free port for HTTP
                cmd += ["--set", "http_bind=127.0.0.1:0"]
            with (tmp_path / f"{name}.log").open("wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        for name in servers:
            check = here(name, services[name]["healthcheck"]["test"][1:])
            done = _until_ok(check, 30)
            log = (tmp_path / f"{name}.log").read_text()[-2000:]
            assert done.returncode == 0, (name, done.stderr, log)
            assert f"ok: {services[name]['command'][1]} at 127.0.0.1:" in done.stdout
        runner = here("job-runner", services["job-runner"]["command"])
        mounts = _host_paths(services["job-runner"], volumes)
        env = {
            k: _in_container(str(v), mounts)
            for k, v in services["job-runner"]["environment"].items()
        }
        done = _until_ok(runner, 30, {"TESSERA_CREDENTIALS": env["TESSERA_CREDENTIALS"]})
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "healthy: leader 127.0.0.1:" in done.stdout
        assert "3/3 tablet server(s) live" in done.stdout, done.stdout
    finally:
        terminate_all(procs)
