"""Data-driven scenarios for the Raft core: a script of commands, each with the trace it must
produce (the format of cockroachdb's `datadriven` package, used by etcd-io/raft's testdata).

The files are `tests/raft/testdata/*.txt`; `tests/raft/test_scenarios.py` runs each one as a
pytest case. To regenerate every expected output after an intended change of behaviour, run

    TESSERA_REWRITE=1 python -m pytest -q tests/raft/test_scenarios.py

and review the diff of the files before committing it: the diff *is* the behaviour change.

File format
-----------
A file is a sequence of cases. A case is one command line, a line `----`, and the expected
output, which ends at the first blank line (or at the end of the file)::

    # comment lines (and blank lines) before a command are kept as they are
    command arg1 arg2 key=value key2=v1,v2
    ----
    expected output, one line or more

Arguments are split like a shell does (`shlex`); `key=value` arguments are options. An output
never contains a blank line, so none is needed to end it. In rewrite mode the commands and
comments are kept and every expected output is replaced by what the command printed.

One environment (`RaftEnv`) serves a whole file: the commands run in order against the same
in-memory group of `RawNode`s. Nothing is timed or threaded: a node moves only when a command
ticks it, steps it with a message or processes its Ready; its election timeout has no jitter
(unless `jitter=` says otherwise) and does not widen after failed elections (unless
`backoff=true`), and its random generator has a fixed seed.

Commands
--------
    add-nodes N [voters=1,2,3] [learners=4] [config=none] [pre-vote=true] [check-quorum=true]
              [election=10] [heartbeat=1] [jitter=1] [lease-reads=false] [max-inflight=256]
              [max-size=1048576] [send-snapshots=true] [backoff=false]
        N new nodes with ids following the existing ones ("1", "2", ...), with empty logs and
        the given bootstrap config (default: the new nodes are the voters); config=none: no
        config at all, a node that joins a running group and learns the config from it
    campaign ID                     ID starts an election (a pre-vote first, if enabled)
    tick ID [N]                     N ticks (default 1)
    tick-election ID                ID's election timeout in ticks (check-quorum on a leader)
    tick-heartbeat ID               a heartbeat interval in ticks
    propose ID DATA...              one proposal per DATA
    propose-conf-change ID TYPE NODE [expected=I]
        TYPE: add-learner, promote, demote or remove; I: the committed config's index the
        change replaces (default: ID's current one)
    read-index ID CTX               a ReadIndex request with context CTX
    transfer-leader ID TARGET
    process-ready ID...             take one Ready of each ID (if it has one), persist it, send
                                    its messages, apply its committed entries, advance
    deliver-msgs [ID...] [from=ID] [type=T]
                                    step the messages in flight (to ID...; from ID; of type T)
                                    into their recipients, each recipient's in sending order
    drop-msgs [ID...] [from=ID] [type=T]
                                    lose those messages instead
    stabilize [ID...]               process Readies and deliver messages until nothing moves
                                    (only among ID... if given)
    partition A,B C ...             split the network into these groups (a node in none is
                                    alone), replacing any earlier cut
    isolate ID                      cut every link of ID
    heal                            restore every link
    snapshot ID                     snapshot ID's state machine (at its applied index)
    compact ID                      the same, then discard ID's log up to the snapshot
    report-unreachable ID PEER      / report-snapshot ID PEER [ok=true]: what a transport says
    status ID                       term, vote, commit, applied, config, and a leader's progress
    raft-log ID                     ID's log, and its snapshot if it has one
    applied ID                      ID's state machine: the data applied, and its config

Output
------
Entries are `INDEX@TERM` followed by `noop` (a new leader's empty entry), the data in quotes, or
`conf:TYPE(NODE)`; a log position is `INDEX@TERM` too (`prev=0@0`: the append starts the log).
A message is `FROM->TO TYPE term=T` and the fields that matter for its type. Processing a Ready
prints `> ID handling Ready` with its flags and then, in processing order, the soft state, the
snapshot, the entries and the hard state persisted, the messages sent, the entries applied and
the read states. Delivering prints `> ID receiving messages` and each message; whenever a command
changes a node's role, term or leader, a line `ID is now ROLE term=T leader=L` follows.
Messages a partition drops are printed under `> dropped (partition)`.

The runner also checks two of Raft's guarantees after every command and stops with an error
(whatever the expected output says) if one breaks: at most one leader per term (Election
Safety), and no two nodes apply different entries at one index (State Machine Safety).
"""

from __future__ import annotations

import difflib
import functools
import os
import random
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from service.raft import (
    NO_NODE,
    ConfigChange,
    ConfigChangeRefused,
    ConfigChangeType,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    NodeId,
    ProposalDropped,
    RaftConfig,
    RaftOptions,
    RawNode,
    Ready,
    Role,
    Snapshot,
    config_after,
)

REWRITE_ENV = "TESSERA_REWRITE"
REWRITE_HINT = (
    f"if the change of behaviour is intended, regenerate the expected output with "
    f"`{REWRITE_ENV}=1 python -m pytest -q <test file>` and review the diff of the scenario file"
)


def rewrite_requested() -> bool:
    """Whether the environment asks to rewrite expected outputs instead of comparing them."""
    return os.environ.get(REWRITE_ENV, "").strip().lower() not in ("", "0", "false", "no")


# -- the file format ---------------------------------------------------------------------------


class ScenarioError(Exception):
    """A malformed file, an unknown command or bad arguments, or a broken invariant."""


@dataclass(frozen=True)
class Command:
    name: str
    args: list[str]
    options: dict[str, str]
    line: int

    def arg(self, i: int, what: str) -> str:
        if i >= len(self.args):
            raise ScenarioError(f"{self.name}: missing argument {i + 1} ({what})")
        return self.args[i]

    def opt(self, key: str, default: str) -> str:
        return self.options.get(key, default)

    def opt_int(self, key: str, default: int) -> int:
        return int(self.options.get(key, default))

    def opt_bool(self, key: str, default: bool) -> bool:
        raw = self.options.get(key)
        if raw is None:
            return default
        if raw not in ("true", "false"):
            raise ScenarioError(f"{self.name}: {key} must be true or false, got {raw!r}")
        return raw == "true"

    def no_more_args(self, n: int) -> None:
        if len(self.args) > n:
            raise ScenarioError(f"{self.name}: unexpected argument(s) {self.args[n:]}")


@dataclass
class Case:
    preamble: list[str]
    """Comment and blank lines before the command, kept as they are."""
    command: str
    line: int
    expected: list[str]


@dataclass
class ScenarioFile:
    cases: list[Case] = field(default_factory=list)
    trailer: list[str] = field(default_factory=list)
    """Comment and blank lines after the last case."""


SEPARATOR = "----"


def parse(text: str, name: str = "<scenario>") -> ScenarioFile:
    lines = text.splitlines()
    out = ScenarioFile()
    pending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            pending.append(line)
            i += 1
            continue
        if line == SEPARATOR:
            raise ScenarioError(f"{name}:{i + 1}: `----` without a command before it")
        if i + 1 >= len(lines) or lines[i + 1] != SEPARATOR:
            raise ScenarioError(f"{name}:{i + 1}: command {line!r} is not followed by `----`")
        expected: list[str] = []
        j = i + 2
        while j < len(lines) and lines[j].strip():
            expected.append(lines[j])
            j += 1
        out.cases.append(Case(pending, line, i + 1, expected))
        pending = []
        i = j + 1  # the blank line that ends the output belongs to the case
    out.trailer = pending
    return out


def render(sf: ScenarioFile, outputs: list[list[str]] | None = None) -> str:
    """The file's text, with `outputs` (one per case) in place of the expected outputs."""
    chunks: list[str] = []
    for k, case in enumerate(sf.cases):
        body = case.expected if outputs is None else outputs[k]
        chunks.append("\n".join([*case.preamble, case.command, SEPARATOR, *body]))
    text = "\n\n".join(chunks)
    if sf.trailer:
        text = (text + "\n\n" if text else "") + "\n".join(sf.trailer)
    return text + "\n"


def parse_command(line: str, lineno: int, option_keys: Iterable[str] = ()) -> Command:
    """Split a command line: words of the form `key=value` whose key is one of `option_keys`
    are options, every other word is an argument (so `propose 1 x=1` proposes "x=1")."""
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise ScenarioError(f"line {lineno}: {e}") from e
    keys = set(option_keys)
    args: list[str] = []
    options: dict[str, str] = {}
    for w in words[1:]:
        key, eq, value = w.partition("=")
        if eq and key in keys:
            options[key] = value
        else:
            args.append(w)
    return Command(words[0], args, options, lineno)


class Env(Protocol):
    def option_keys(self, command: str) -> Iterable[str]:
        """The options `command` takes (every other word is an argument)."""
        ...

    def run(self, cmd: Command) -> list[str]: ...


def dispatch(handlers: Mapping[str, Callable[[Command], object]], cmd: Command) -> None:
    """Run `cmd` by its handler (each environment's `run`); ScenarioError for an unknown one."""
    handler = handlers.get(cmd.name)
    if handler is None:
        raise ScenarioError(f"unknown command {cmd.name!r}")
    handler(cmd)


@dataclass(frozen=True)
class Outcome:
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


def run_text(text: str, env: Env, name: str = "<scenario>") -> Outcome:
    """Run every case of `text` against `env`; return the text and what it would be with the
    produced outputs (and the layout normalized: one blank line after each output, one newline
    at the end)."""
    sf = parse(text, name)
    outputs: list[list[str]] = []
    for case in sf.cases:
        try:
            word = case.command.split(maxsplit=1)[0]
            cmd = parse_command(case.command, case.line, env.option_keys(word))
            produced = env.run(cmd)
        except ScenarioError as e:
            raise ScenarioError(f"{name}:{case.line}: {case.command}: {e}") from e
        except Exception as e:
            raise ScenarioError(
                f"{name}:{case.line}: {case.command}: {type(e).__name__}: {e}"
            ) from e
        lines = [ln.rstrip() for ln in produced]
        if any(not ln.strip() for ln in lines):
            raise ScenarioError(f"{name}:{case.line}: the output has a blank line: {lines}")
        outputs.append(lines)
    return Outcome(text, render(sf, outputs))


def check_file(path: Path, env: Env, rewrite: bool, label: str | None = None) -> None:
    """Compare the file's expected outputs with what `env` produces (raising AssertionError with
    a unified diff on a mismatch), or, with `rewrite`, write the produced outputs into it."""
    name = label or path.name
    outcome = run_text(path.read_text(), env, name)
    if rewrite:
        if not outcome.ok:
            path.write_text(outcome.actual)
        return
    if not outcome.ok:
        diff = "".join(
            difflib.unified_diff(
                outcome.expected.splitlines(keepends=True),
                outcome.actual.splitlines(keepends=True),
                fromfile=f"{name} (expected)",
                tofile=f"{name} (produced)",
            )
        )
        raise AssertionError(f"{name}: the produced trace differs:\n{diff}\n{REWRITE_HINT}")


# -- formatting --------------------------------------------------------------------------------


def _quote(data: bytes) -> str:
    try:
        s = data.decode()
    except UnicodeDecodeError:
        return "0x" + data.hex()
    return '"' + s + '"' if s.isprintable() and '"' not in s else repr(s)


def fmt_entry(e: Entry) -> str:
    head = f"{e.index}@{e.term}"
    if e.type is EntryType.CONFIG:
        cc = ConfigChange.decode(e.data)
        return f"{head} conf:{cc.type.value}({cc.node})"
    return f"{head} noop" if not e.data else f"{head} {_quote(e.data)}"


def fmt_ids(ids: Iterable[NodeId]) -> str:
    return ",".join(sorted(ids, key=_id_key)) or "-"


def fmt_config(c: RaftConfig) -> str:
    return f"voters={fmt_ids(c.voters)} learners={fmt_ids(c.learners)} index={c.index}"


def fmt_snapshot(s: Snapshot) -> str:
    return f"{s.meta.index}@{s.meta.term} {fmt_config(s.meta.config)}"


def fmt_msg(m: Message) -> str:
    t = m.type
    s = f"{m.frm}->{m.to} {t.value} term={m.term}"
    if t is MessageType.APP:
        s += f" prev={m.index}@{m.log_term} commit={m.commit}"
        if m.entries:
            s += " [" + ", ".join(fmt_entry(e) for e in m.entries) + "]"
    elif t is MessageType.APP_RESP:
        if m.reject:
            s += f" reject index={m.index} hint={m.reject_hint}@{m.log_term}"
        else:
            s += f" index={m.index}"
    elif t in (MessageType.VOTE, MessageType.PRE_VOTE):
        s += f" last={m.index}@{m.log_term}"
    elif t in (MessageType.VOTE_RESP, MessageType.PRE_VOTE_RESP):
        s += " rejected" if m.reject else " granted"
    elif t is MessageType.HEARTBEAT:
        s += f" commit={m.commit}"
    elif t is MessageType.SNAP:
        assert m.snapshot is not None
        s += f" snapshot={fmt_snapshot(m.snapshot)}"
    if m.context and t is not MessageType.SNAP:
        s += f" ctx={_quote(m.context)}"
    return s


def fmt_span(first: int, last: int) -> str:
    return f"[{first}, {last}]" if first <= last else f"empty (next index {first})"


def _id_key(nid: str) -> tuple[int, str]:
    return (int(nid), "") if nid.isdigit() else (1 << 30, nid)


# -- the in-memory group -----------------------------------------------------------------------


@dataclass
class _Node:
    raw: RawNode
    storage: MemoryStorage
    election_tick: int
    heartbeat_tick: int
    applied: list[bytes] = field(default_factory=list)
    """The state machine: the data of every non-empty NORMAL entry applied, in order."""
    applied_config: RaftConfig = field(default_factory=lambda: RaftConfig(frozenset()))
    applied_index: int = 0


def _encode_state(values: list[bytes]) -> bytes:
    return b"\n".join(values)


def _decode_state(data: bytes) -> list[bytes]:
    return [v for v in data.split(b"\n") if v]


_CONF_TYPES = {
    "add-learner": ConfigChangeType.ADD_LEARNER,
    "promote": ConfigChangeType.PROMOTE,
    "demote": ConfigChangeType.DEMOTE,
    "remove": ConfigChangeType.REMOVE,
}

_STABILIZE_ROUNDS = 1000

_OPTIONS: dict[str, frozenset[str]] = {
    "add-nodes": frozenset(
        {
            "voters",
            "learners",
            "config",
            "pre-vote",
            "check-quorum",
            "election",
            "heartbeat",
            "jitter",
            "lease-reads",
            "max-inflight",
            "max-size",
            "send-snapshots",
            "backoff",
        }
    ),
    "propose-conf-change": frozenset({"expected"}),
    "deliver-msgs": frozenset({"from", "type"}),
    "drop-msgs": frozenset({"from", "type"}),
    "report-snapshot": frozenset({"ok"}),
}


class RaftEnv:
    """A group of Raft cores wired by an explicit network (see the module docstring)."""

    def __init__(self) -> None:
        self.nodes: dict[NodeId, _Node] = {}
        self.network: list[Message] = []
        """Messages sent and not yet delivered or dropped, in sending order."""
        self.cut: set[tuple[NodeId, NodeId]] = set()
        self.leaders: dict[int, NodeId] = {}
        self.applied_at: dict[int, tuple[int, EntryType, bytes]] = {}
        self.out: list[str] = []
        self.handlers: dict[str, Callable[[Command], None]] = {
            "add-nodes": self._add_nodes,
            "campaign": self._campaign,
            "tick": self._tick,
            "tick-election": self._tick_election,
            "tick-heartbeat": self._tick_heartbeat,
            "propose": self._propose,
            "propose-conf-change": self._propose_conf_change,
            "read-index": self._read_index,
            "transfer-leader": self._transfer_leader,
            "process-ready": self._process_ready,
            "deliver-msgs": self._deliver_msgs,
            "drop-msgs": self._drop_msgs,
            "stabilize": self._stabilize,
            "partition": self._partition,
            "isolate": self._isolate,
            "heal": self._heal,
            "snapshot": self._snapshot,
            "compact": self._compact,
            "report-unreachable": self._report_unreachable,
            "report-snapshot": self._report_snapshot,
            "status": self._status,
            "raft-log": self._raft_log,
            "applied": self._applied,
        }

    def option_keys(self, command: str) -> Iterable[str]:
        return _OPTIONS.get(command, frozenset())

    def run(self, cmd: Command) -> list[str]:
        self.out = []
        dispatch(self.handlers, cmd)
        return self.out

    # -- helpers ---------------------------------------------------------------------------

    def _id(self, raw: str) -> NodeId:
        nid = NodeId(raw)
        if nid not in self.nodes:
            raise ScenarioError(f"no node {raw!r}")
        return nid

    def _ids(self, raws: Iterable[str]) -> list[NodeId]:
        return [self._id(r) for r in raws]

    def _sorted_ids(self) -> list[NodeId]:
        return sorted(self.nodes, key=_id_key)

    def _view(self, nid: NodeId) -> tuple[Role, int, NodeId]:
        r = self.nodes[nid].raw.raft
        return r.role(), r.term, r.lead

    def _acting(self, nid: NodeId, action: Callable[[], None], indent: str = "") -> None:
        """Run `action` on `nid`, print an error it reports, and any change of its state."""
        before = self._view(nid)
        try:
            action()
        except (ProposalDropped, ConfigChangeRefused) as e:
            self.out.append(f"{indent}error: {type(e).__name__}: {e}")
        after = self._view(nid)
        if after != before:
            role, term, lead = after
            self.out.append(f"{indent}{nid} is now {role.value} term={term} leader={lead or '-'}")
            if role is Role.LEADER:
                other = self.leaders.setdefault(term, nid)
                if other != nid:
                    raise ScenarioError(f"two leaders in term {term}: {other} and {nid}")

    # -- topology --------------------------------------------------------------------------

    def _add_nodes(self, cmd: Command) -> None:
        cmd.no_more_args(1)
        n = int(cmd.arg(0, "number of nodes"))
        first = len(self.nodes) + 1
        new = [NodeId(str(i)) for i in range(first, first + n)]
        config: RaftConfig | None
        if cmd.opt("config", "") == "none":
            config = None
        else:
            voters = cmd.opt("voters", "")
            learners = cmd.opt("learners", "")
            config = RaftConfig(
                frozenset(NodeId(v) for v in voters.split(",") if v) if voters else frozenset(new),
                frozenset(NodeId(v) for v in learners.split(",") if v),
            )
        election = cmd.opt_int("election", 10)
        heartbeat = cmd.opt_int("heartbeat", 1)
        for nid in new:
            opts = RaftOptions(
                id=nid,
                election_tick=election,
                heartbeat_tick=heartbeat,
                election_jitter_tick=cmd.opt_int("jitter", 1),
                election_backoff=cmd.opt_bool("backoff", False),
                pre_vote=cmd.opt_bool("pre-vote", True),
                check_quorum=cmd.opt_bool("check-quorum", True),
                lease_reads=cmd.opt_bool("lease-reads", False),
                max_inflight_msgs=cmd.opt_int("max-inflight", 256),
                max_size_per_msg=cmd.opt_int("max-size", 1 << 20),
                send_snapshots=cmd.opt_bool("send-snapshots", True),
            )
            storage = MemoryStorage()
            raw = RawNode(opts, storage, random.Random(int(nid)), config)
            node = _Node(raw, storage, election, heartbeat)
            node.applied_config = config or RaftConfig(frozenset())
            self.nodes[nid] = node
            r = raw.raft
            self.out.append(
                f"{nid}: {r.role().value} term={r.term} {fmt_config(r.config)}"
                if config is not None
                else f"{nid}: {r.role().value} term={r.term} no config"
            )

    def _partition(self, cmd: Command) -> None:
        groups = [set(self._ids(g.split(","))) for g in cmd.args]
        ids = self._sorted_ids()
        self.cut.clear()
        for a in ids:
            for b in ids:
                if a != b and not any(a in g and b in g for g in groups):
                    self.cut.add((a, b))
        self._print_cut()

    def _isolate(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        for other in self.nodes:
            if other != nid:
                self.cut.add((nid, other))
                self.cut.add((other, nid))
        self._print_cut()

    def _heal(self, cmd: Command) -> None:
        self.cut.clear()
        self.out.append("all links restored")

    def _print_cut(self) -> None:
        ids = self._sorted_ids()
        for a in ids:
            cut = [b for b in ids if (a, b) in self.cut]
            if cut:
                self.out.append(f"{a} cannot reach {fmt_ids(cut)}")

    # -- inputs ----------------------------------------------------------------------------

    def _campaign(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        self._acting(nid, self.nodes[nid].raw.campaign)

    def _ticks(self, nid: NodeId, n: int) -> None:
        raw = self.nodes[nid].raw

        def tick() -> None:
            for _ in range(n):
                raw.tick()

        self._acting(nid, tick)
        if not self.out:
            self.out.append(f"{nid} ticked {n}x")

    def _tick(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        self._ticks(nid, int(cmd.args[1]) if len(cmd.args) > 1 else 1)

    def _tick_election(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        self._ticks(nid, self.nodes[nid].election_tick)

    def _tick_heartbeat(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        self._ticks(nid, self.nodes[nid].heartbeat_tick)

    def _propose(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        raw = self.nodes[nid].raw
        for data in cmd.args[1:] or [""]:

            def propose(data: str = data) -> None:
                index, term = raw.propose(data.encode())
                self.out.append(f"proposed {index}@{term} {_quote(data.encode())}")

            self._acting(nid, propose)

    def _propose_conf_change(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        kind = cmd.arg(1, "change type")
        if kind not in _CONF_TYPES:
            raise ScenarioError(f"change type must be one of {sorted(_CONF_TYPES)}, got {kind!r}")
        raw = self.nodes[nid].raw
        expected = cmd.opt_int("expected", raw.raft.committed_config.index)
        cc = ConfigChange(_CONF_TYPES[kind], NodeId(cmd.arg(2, "node to change")), expected)

        def propose() -> None:
            index, term = raw.propose_config_change(cc)
            self.out.append(f"proposed {index}@{term} conf:{cc.type.value}({cc.node})")

        self._acting(nid, propose)

    def _read_index(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        ctx = cmd.arg(1, "context")
        raw = self.nodes[nid].raw

        def read() -> None:
            raw.read_index(ctx.encode())
            self.out.append(f"read-index {_quote(ctx.encode())} requested")

        self._acting(nid, read)

    def _transfer_leader(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        target = self._id(cmd.arg(1, "target"))
        self._acting(nid, lambda: self.nodes[nid].raw.transfer_leader(target))
        if not self.out:
            self.out.append(f"{nid} asked to transfer leadership to {target}")

    def _report_unreachable(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        peer = self._id(cmd.arg(1, "peer"))
        self._acting(nid, lambda: self.nodes[nid].raw.report_unreachable(peer))
        if not self.out:
            self.out.append(f"{nid} told {peer} is unreachable")

    def _report_snapshot(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        peer = self._id(cmd.arg(1, "peer"))
        ok = cmd.opt_bool("ok", True)
        self._acting(nid, lambda: self.nodes[nid].raw.report_snapshot(peer, ok))
        if not self.out:
            self.out.append(f"{nid} told the snapshot to {peer} {'arrived' if ok else 'failed'}")

    # -- Ready processing and delivery -----------------------------------------------------

    def _handle_ready(self, nid: NodeId) -> bool:
        node = self.nodes[nid]
        if not node.raw.has_ready():
            return False
        rd = node.raw.ready()
        flags = [
            f
            for f, on in (("must-sync", rd.must_sync), ("send-early", rd.send_before_persist))
            if on
        ]
        self.out.append(f"> {nid} handling Ready" + (f" ({', '.join(flags)})" if flags else ""))
        self._print_ready(rd)
        # Persist, send, apply, advance (types.Ready's contract).
        if rd.snapshot is not None:
            node.storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            node.storage.append(rd.entries)
        if rd.hard_state is not None:
            node.storage.set_hard_state(rd.hard_state)
        self.network.extend(rd.messages)
        if rd.snapshot is not None:
            node.applied = _decode_state(rd.snapshot.data)
            node.applied_config = rd.snapshot.meta.config
            node.applied_index = rd.snapshot.meta.index
        for e in rd.committed_entries:
            self._apply(nid, node, e)
        node.raw.advance(rd)
        return True

    def _print_ready(self, rd: Ready) -> None:
        if rd.soft_state is not None:
            ss = rd.soft_state
            self.out.append(
                f"  soft-state: {ss.role.value} term={ss.term} leader={ss.leader or '-'}"
            )
        if rd.snapshot is not None:
            self.out.append(f"  snapshot: {fmt_snapshot(rd.snapshot)}")
        for e in rd.entries:
            self.out.append(f"  persist: {fmt_entry(e)}")
        if rd.hard_state is not None:
            hs = rd.hard_state
            self.out.append(
                f"  hard-state: term={hs.term} vote={hs.vote or '-'} commit={hs.commit}"
            )
        for m in rd.messages:
            self.out.append(f"  send: {fmt_msg(m)}")
        for e in rd.committed_entries:
            self.out.append(f"  apply: {fmt_entry(e)}")
        for rs in rd.read_states:
            self.out.append(f"  read-state: {_quote(rs.context)} index={rs.index}")

    def _apply(self, nid: NodeId, node: _Node, e: Entry) -> None:
        if e.index != node.applied_index + 1:
            raise ScenarioError(f"{nid} applies {e.index} after {node.applied_index}")
        seen = self.applied_at.setdefault(e.index, (e.term, e.type, e.data))
        if seen != (e.term, e.type, e.data):
            raise ScenarioError(
                f"{nid} applies {fmt_entry(e)} where another node applied term {seen[0]}"
            )
        node.applied_index = e.index
        node.applied_config = config_after(node.applied_config, e.type, e.data, e.index)
        if e.type is EntryType.NORMAL and e.data:
            node.applied.append(e.data)

    def _process_ready(self, cmd: Command) -> None:
        for nid in self._ids(cmd.args):
            if not self._handle_ready(nid):
                self.out.append(f"> {nid} has no Ready")

    def _select(self, cmd: Command) -> Callable[[Message], bool]:
        to = set(self._ids(cmd.args))
        frm = cmd.options.get("from")
        typ = cmd.options.get("type")
        if typ is not None and typ not in MessageType.__members__:
            raise ScenarioError(f"unknown message type {typ!r}")

        def selected(m: Message) -> bool:
            return (
                (not to or m.to in to)
                and (frm is None or m.frm == frm)
                and (typ is None or m.type.value == typ)
            )

        return selected

    def _deliver(self, selected: Callable[[Message], bool]) -> bool:
        """Deliver the selected messages in flight; whether any was delivered or dropped."""
        batch = [m for m in self.network if selected(m)]
        if not batch:
            return False
        self.network = [m for m in self.network if not selected(m)]
        dropped = [m for m in batch if (m.frm, m.to) in self.cut or m.to not in self.nodes]
        if dropped:
            self.out.append("> dropped (partition)")
            self.out.extend(f"  {fmt_msg(m)}" for m in dropped)
        for nid in self._sorted_ids():
            mine = [m for m in batch if m.to == nid and (m.frm, m.to) not in self.cut]
            if not mine:
                continue
            self.out.append(f"> {nid} receiving messages")
            raw = self.nodes[nid].raw
            for m in mine:
                self.out.append(f"  {fmt_msg(m)}")
                self._acting(nid, functools.partial(raw.step, m), indent="    ")
        return True

    def _deliver_msgs(self, cmd: Command) -> None:
        if not self._deliver(self._select(cmd)):
            self.out.append("no messages")

    def _drop_msgs(self, cmd: Command) -> None:
        selected = self._select(cmd)
        dropped = [m for m in self.network if selected(m)]
        self.network = [m for m in self.network if not selected(m)]
        self.out.extend(f"dropped {fmt_msg(m)}" for m in dropped)
        if not dropped:
            self.out.append("no messages")

    def _stabilize(self, cmd: Command) -> None:
        among = set(self._ids(cmd.args)) or set(self.nodes)
        for _ in range(_STABILIZE_ROUNDS):
            moved = False
            for nid in self._sorted_ids():
                if nid in among:
                    while self._handle_ready(nid):
                        moved = True
            if self._deliver(lambda m: m.to in among and m.frm in among):
                moved = True
            if not moved:
                if not self.out:
                    self.out.append("nothing to do")
                return
        raise ScenarioError(f"no quiet state after {_STABILIZE_ROUNDS} rounds")

    # -- storage ---------------------------------------------------------------------------

    def _take_snapshot(self, cmd: Command) -> tuple[NodeId, Snapshot]:
        nid = self._id(cmd.arg(0, "node"))
        cmd.no_more_args(1)
        node = self.nodes[nid]
        snap = node.storage.create_snapshot(
            node.applied_index, node.applied_config, _encode_state(node.applied)
        )
        return nid, snap

    def _snapshot(self, cmd: Command) -> None:
        nid, snap = self._take_snapshot(cmd)
        self.out.append(f"{nid}: snapshot {fmt_snapshot(snap)}")

    def _compact(self, cmd: Command) -> None:
        nid, snap = self._take_snapshot(cmd)
        self.nodes[nid].storage.compact(snap.meta.index)
        log = self.nodes[nid].raw.raft.log
        self.out.append(f"{nid}: snapshot {fmt_snapshot(snap)}")
        self.out.append(f"  log now {fmt_span(log.first_index(), log.last_index())}")

    # -- introspection ---------------------------------------------------------------------

    def _status(self, cmd: Command) -> None:
        for nid in self._ids(cmd.args):
            st = self.nodes[nid].raw.status()
            self.out.append(
                f"{nid}: {st.role.value} term={st.term} leader={st.lead or '-'} "
                f"vote={st.vote or '-'} commit={st.commit} applied={st.applied} "
                f"last={st.last_index}"
            )
            self.out.append(f"  config: {fmt_config(st.config)}")
            if st.committed_config != st.config:
                self.out.append(f"  committed config: {fmt_config(st.committed_config)}")
            if st.lead_transferee != NO_NODE:
                self.out.append(f"  transferring leadership to {st.lead_transferee}")
            for peer in sorted(st.progress, key=_id_key):
                pr = st.progress[peer]
                flags = [pr.state.value]
                if pr.recent_active:
                    flags.append("active")
                if pr.is_learner:
                    flags.append("learner")
                self.out.append(
                    f"  progress {peer}: match={pr.match} next={pr.next} {' '.join(flags)}"
                )

    def _raft_log(self, cmd: Command) -> None:
        nid = self._id(cmd.arg(0, "node"))
        log = self.nodes[nid].raw.raft.log
        snap = log.snapshot()
        first, last = log.first_index(), log.last_index()
        self.out.append(
            f"{nid}: log {fmt_span(first, last)} committed={log.committed} applied={log.applied}"
        )
        if snap.meta.index:
            self.out.append(f"  snapshot: {fmt_snapshot(snap)}")
        for e in log.slice(first, last + 1):
            self.out.append(f"  {fmt_entry(e)}")

    def _applied(self, cmd: Command) -> None:
        for nid in self._ids(cmd.args):
            node = self.nodes[nid]
            values = " ".join(_quote(v) for v in node.applied) or "-"
            self.out.append(f"{nid}: applied={node.applied_index} data: {values}")
            self.out.append(f"  config: {fmt_config(node.applied_config)}")
