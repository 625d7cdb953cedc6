"""docs/PS.md and docs/SWAP.md, the two user guides, against the code.

What a guide shows a user is checked as tests/test_readme_commands.py checks README.md:

* every command line of the guides' ``sh`` blocks is read by the parser of its command
  (``minicaffe ...``, ``python scripts/launch_ps.py ...`` with the ``minicaffe train`` flags
  after its ``--``, ``python3 scripts/tuner_table.py ...``), and the flags the text and its
  option tables name are options of their command, the lists of options complete;
* the defaults, choices, environment variables, module names, files and the wire header the
  text cites are the code's;
* the commands that run on a CPU run, shortened (a few iterations of the digits solver, CPU
  workers, budgets of MiB, tmp folders): the launcher's quick start, ``--resume auto``, the
  flags after ``--``, shards and workers by hand, CURVE keys, link emulation, ``train --swap
  dynamic``, ``plan`` on a saved profile and on the synthetic device, ``mem``; where a guide
  prints a table of what such a command says (SWAP.md sections 7 and 9), a row of it is run;
* the GPU-only ones (``--comm nccl``, ``--cuda-graph``, ``--gpu``) refuse or fall back on a
  CPU with a message that says why.

The digits data and one saved profile are made once per session (``digits``); every test that
trains works in its own folder, which links to them.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minicaffe import cli
from test_readme_commands import (FLAG, PLACEHOLDERS, _subparsers, is_option, parse_only,
                                  split_comment)

ROOT = Path(__file__).resolve().parents[1]
GUIDES = {name: (ROOT / "docs" / name).read_text() for name in ("PS.md", "SWAP.md")}
SCRIPTS = ("python scripts/", "python3 scripts/")
DIGITS = "prototxt/digits/solver.prototxt"
DIGITS_NET = "prototxt/digits/train_val.prototxt"
sys.path.insert(0, str(ROOT))           # scripts.launch_ps, scripts.ps_scaling, ...


# --------------------------------------------------------------- the guides' text
def sh_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line inside a ```sh block, a line that ends in a
    backslash joined with the next (numbered by its first)."""
    out, inside, held = [], False, None
    for n, line in enumerate(text.splitlines(), 1):
        fence = line.strip()
        if fence.startswith("```"):
            inside = not inside and fence == "```sh"
            continue
        if not inside:
            continue
        held = (n, line) if held is None else (held[0], held[1] + " " + line.strip())
        if held[1].rstrip().endswith("\\"):
            held = (held[0], held[1].rstrip()[:-1])
            continue
        out.append(held)
        held = None
    return out


def commands(text: str) -> list[tuple[int, str]]:
    """(line, command) of the minicaffe and scripts/ commands of the ``sh`` blocks."""
    found = []
    for n, line in sh_lines(text):
        code, _ = split_comment(line)
        for segment in (s.strip() for s in code.split("&&")):
            if segment.startswith("minicaffe ") or segment.startswith(SCRIPTS):
                found.append((n, segment))
    return found


def prose(text: str) -> str:
    """The text without its code blocks, each run of white space one blank."""
    return re.sub(r"\s+", " ", re.sub(r"```.*?```", "", text, flags=re.S))


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", prose(text))


def md_table(text: str, header: str) -> dict:
    """{first cell: cells} of the markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, row in enumerate(lines) if row.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


# ------------------------------------------------------------- commands and parsers
def script(name: str):
    return importlib.import_module(f"scripts.{name}")


def entry_of(text: str):
    """(main, argv) of a guide command."""
    words = shlex.split(text)
    if words[0] == "minicaffe":
        return cli.main, words[1:]
    return script(Path(words[1]).stem).main, words[2:]


class _Got(Exception):
    pass


def parser_of(monkeypatch, main, argv=()) -> argparse.ArgumentParser:
    """The top-level parser ``main(argv)`` builds (stopped where it would parse)."""
    def grab(self, args=None, namespace=None):
        raise _Got(self)
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", grab)
        try:
            main(list(argv))
        except _Got as got:
            return got.args[0]
    raise AssertionError(f"{main} did not parse")


def minicaffe_parser(*names) -> argparse.ArgumentParser:
    """``minicaffe NAME ...``'s parser: ``("train",)``, ``("ps", "server")``."""
    parser = cli.build_parser()
    for name in names:
        parser = _subparsers(parser)[name]
    return parser


def script_parsers(monkeypatch) -> dict:
    return {name: parser_of(monkeypatch, script(name).main, ["--solver", "S"] if name ==
                            "launch_ps" else []) for name in
            ("launch_ps", "ps_scaling", "tuner_table", "swap_budgets", "table3")}


def check_command(monkeypatch, text: str) -> list[str]:
    """``text`` read by its command's parser (and, for the launcher, what follows ``--`` by
    ``minicaffe train``'s): the failures."""
    main, argv = entry_of(text)
    failed = []
    ok, why = parse_only(monkeypatch, main, argv)
    if not ok:
        failed.append(why)
    if "--" in argv and "launch_ps" in text:
        ok, why = parse_only(monkeypatch, cli.main,
                             ["train", "--solver", "S", *argv[argv.index("--") + 1:]])
        if not ok:
            failed.append(f"the flags after --: {why}")
    return failed


COMMANDS = [(g, n, c) for g, text in GUIDES.items() for n, c in commands(text)]


@pytest.mark.parametrize("guide, line, text", COMMANDS,
                         ids=[f"{g}:L{n}" for g, n, _ in COMMANDS])
def test_guide_command_parses(guide, line, text, monkeypatch):
    failed = check_command(monkeypatch, text)
    assert not failed, f"docs/{guide} line {line}: {text}: " + "; ".join(failed)


def test_the_guides_have_the_commands_they_are_known_to_have():
    """The extraction still finds the guides' commands (a changed fence would let the test
    above pass on nothing)."""
    ps = [c for g, _, c in COMMANDS if g == "PS.md"]
    swap = [c for g, _, c in COMMANDS if g == "SWAP.md"]
    assert sum(c.startswith("python scripts/launch_ps.py") for c in ps) >= 7
    assert sum(c.startswith("minicaffe ps server") for c in ps) == 2
    assert sum(c.startswith("minicaffe train") for c in ps) == 2
    assert sum(c.startswith("minicaffe plan") for c in swap) >= 8
    assert sum(c.startswith("minicaffe train") for c in swap) == 3
    assert any("tuner_table.py" in c for c in swap)


@pytest.mark.parametrize("line", [
    "python scripts/launch_ps.py --solver S --gpus 0,1 -- --max-iter 200 --swap dynamc",
    "python scripts/launch_ps.py --solver S --cpu-workers 2 --gpus 0,1",
    "minicaffe ps server --shard 0 --bind tcp://127.0.0.1:5600",      # --world-size missing
    "minicaffe plan --model M --budget 12G --layout host",
])
def test_a_wrong_guide_line_fails(line, monkeypatch):
    assert check_command(monkeypatch, line)
    assert commands(f"```sh\n{line}  # a comment\n```\n") == [(2, line)]


def test_the_flags_the_guides_name_are_options(monkeypatch):
    """Every ``--flag`` the guides' text names is an option of one of the commands they
    show (a flag renamed in the code and not in the guide fails here)."""
    parsers = [minicaffe_parser(c) for c in ("train", "plan", "mem")]
    parsers += [minicaffe_parser("ps", "server"), minicaffe_parser("ps", "keys")]
    parsers += list(script_parsers(monkeypatch).values())
    unknown = [(g, f) for g, text in GUIDES.items() for s in spans(text)
               for f in FLAG.findall(s) if f.startswith("--")
               and not any(is_option(p, f) for p in parsers)]
    assert not unknown, f"flags the guides name that no command takes: {unknown}"


def test_inline_commands_take_the_flags_they_show(monkeypatch):
    """`minicaffe ps keys --curve-dir D [--clients N]`, `train --swap dynamic --auto-batch
    --save-profile`, `launch_ps.py --resume auto`, `ps_scaling.py --cuda-graph`: each flag
    is an option of its command; a `minicaffe` line with two options or more parses whole
    (`k` and `k*` read as a number, as README's placeholders)."""
    subs = _subparsers(cli.build_parser())
    scripts = script_parsers(monkeypatch)
    bad, seen = [], 0
    for g, text in GUIDES.items():
        for s in spans(text):
            words = s.split()
            whole = words[:1] == ["minicaffe"]      # a command line, not a feature's name
            if whole:
                words = words[1:]
            if len(words) < 2:
                continue
            if words[0] in subs:
                parser = subs[words[0]]
                if words[0] == "ps" and words[1] in _subparsers(parser):
                    parser = _subparsers(parser)[words[1]]
            elif Path(words[0]).stem in scripts and words[0].endswith(".py"):
                parser = scripts[Path(words[0]).stem]
            else:
                continue
            seen += 1
            flags = [w for w in words[1:] if FLAG.fullmatch(w.strip("[]"))]
            bad += [f"{g}: {s}: {f}" for f in flags if not is_option(parser, f.strip("[]"))]
            if whole and len(flags) >= 2 and "..." not in s and "[" not in s:
                line = "minicaffe " + " ".join(PLACEHOLDERS.get(w.rstrip("*"), w) for w in words)
                bad += [f"{g}: {s}: {why}" for why in check_command(monkeypatch, line)]
    assert seen >= 15
    assert not bad, "inline commands of the guides that their command refuses: " + "; ".join(bad)


def test_ps_option_lists_are_the_parsers():
    """PS.md's `minicaffe train` table names every option of train's data-parallel group,
    and its `minicaffe ps server` list every option of the server, nothing else."""
    text = GUIDES["PS.md"]
    train = minicaffe_parser("train")
    table = text.split("`minicaffe train` (data-parallel group):", 1)[1].split("\n\n", 2)[1]
    named = {f for row in table.splitlines()[2:] for f in FLAG.findall(row.split("|")[1])}
    group = next(g for g in train._action_groups if g.title.startswith("data-parallel"))
    want = {o for a in group._group_actions for o in a.option_strings if o.startswith("--")}
    assert want <= named, f"train options PS.md's table leaves out: {sorted(want - named)}"
    assert all(is_option(train, f) for f in named), named
    listed = prose(text).split("`minicaffe ps server`: `", 1)[1].split("`", 1)[0]
    server = minicaffe_parser("ps", "server")
    have = {o for a in server._actions for o in a.option_strings if o.startswith("--")} - {
        "--help"}
    assert set(FLAG.findall(listed)) == have


def test_the_defaults_and_choices_the_guides_state():
    """`--lr-rule {eq9,linear,sqrt}` (default eq9) and its kind: the choices are the
    parser's, the default its default or the one its help names; PS.md's option defaults
    (120 s, buckets of 8 and 25 MiB, a tail of 8 MiB, frames of 1 GiB) are the code's."""
    from ps import overlap, protocol
    train, plan = minicaffe_parser("train"), minicaffe_parser("plan")
    stated = re.findall(r"`(--[\w-]+) \{([\w,]+)\}` \(default (\w+)", prose(GUIDES["SWAP.md"]))
    assert len(stated) >= 4
    for flag, choices, default in stated:
        action = train._option_string_actions[flag]
        assert set(choices.split(",")) == set(action.choices), flag
        assert action.default == default or f"default {default}" in action.help, flag
        if flag in plan._option_string_actions:
            assert plan._option_string_actions[flag].choices == action.choices
    ps = prose(GUIDES["PS.md"])
    assert "`--ps-timeout S` | seconds to wait for the slowest peer (default 120)" in ps
    assert train._option_string_actions["--ps-timeout"].default == 120
    assert "(ps: 8 MiB, NCCL: 25)" in ps
    assert (overlap.DEFAULT_PS_BUCKET_MB, overlap.DEFAULT_BUCKET_MB) == (8, 25)
    assert "(default 8; 0 turns it off" in ps and overlap.DEFAULT_PS_TAIL_MB == 8
    assert "(`--max-message-bytes`, default 1 GiB per frame)" in ps
    assert minicaffe_parser("ps", "server")._option_string_actions[
        "--max-message-bytes"].default == protocol.DEFAULT_MAX_FRAME_BYTES == 1 << 30
    assert "(default 1.0)" in prose(GUIDES["SWAP.md"])
    assert "default 1.0" in train._option_string_actions["--convexity"].help


def test_the_names_the_guides_cite_exist():
    """Environment variables are read by the code, `swap.x.y` names import, files exist."""
    source = "\n".join(p.read_text() for d in ("minicaffe", "swap", "ps", "scripts")
                       for p in (ROOT / d).rglob("*.py"))
    missing = []
    for g, text in GUIDES.items():
        for var in sorted(set(re.findall(r"\bMINICAFFE_[A-Z_]+\b", text))):
            if f'"{var}"' not in source:
                missing.append(f"{g}: ${var} (read nowhere)")
        for name in sorted(set(re.findall(r"`((?:swap|ps|minicaffe)\.[A-Za-z_][\w.]*)", text))):
            if name == "minicaffe.swap.profile":        # the profile's schema, not a module
                continue
            parts, obj, rest = name.split("."), None, []
            for i in range(len(parts), 0, -1):
                with contextlib.suppress(ImportError):
                    obj, rest = importlib.import_module(".".join(parts[:i])), parts[i:]
                    break
            for attr in rest:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(f"{g}: {name}")
        for path in set(re.findall(r"\b((?:swap|ps|scripts|tests|docs)/[\w/.{},-]+\."
                                   r"(?:py|md|csv|png|txt|json)\}?)", text)):
            m = re.match(r"(.*)\{(.*)\}(.*)", path)
            for p in ([m.group(1) + x + m.group(3) for x in m.group(2).split(",")] if m
                      else [path]):
                if not (ROOT / p).exists():
                    missing.append(f"{g}: {p}")
    assert not missing, missing


def test_the_wire_header_is_the_table():
    """PS.md's header table: 104 bytes, `MCPS`, version 3, the ops and dtype codes."""
    import numpy as np
    from ps import protocol as P
    rows = md_table(GUIDES["PS.md"], "| field | type |")
    assert P.HEADER.size == 104 and "one fixed little-endian struct of 104 bytes" in prose(
        GUIDES["PS.md"])
    assert rows["magic"][2] == f"`{P.MAGIC.decode()}`"
    assert rows["version"][2] == str(P.PROTOCOL_VERSION)
    assert rows["op"][2].split(", ") == [op.name for op in P.Op]
    codes = dict(re.findall(r"(\d+) (\w+)", rows["dtype"][2]))
    assert {int(c): np.dtype(t) for c, t in codes.items()} == {
        int(k): v for k, v in P._NP.items()}
    assert rows["ndim"][2] == f"at most {P.MAX_NDIM}"
    assert rows["flags"][2].startswith(f"`FLAG_SHM` ({P.FLAG_SHM})")


def test_the_tests_section_names_real_tests(monkeypatch):
    """PS.md's Tests list names test files that exist, and test_security.py's count."""
    text = GUIDES["PS.md"].split("## Tests", 1)[1].split("\n## ", 1)[0]
    for name in re.findall(r"`(test_\w+\.py)`", text):
        assert (ROOT / "tests" / "ps" / name).exists(), name
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "ps"))
    import test_security
    assert f"{len(test_security.BAD)} kinds of malformed or oversized frames" in text


# ------------------------------------------------------------------ running them
def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["PYTHONUNBUFFERED"] = "1"
    return e


def run(cwd, *args, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def launch(cwd, *args, timeout=90) -> subprocess.CompletedProcess:
    """``python scripts/launch_ps.py ARGS`` in ``cwd``."""
    return run(cwd, ROOT / "scripts" / "launch_ps.py", *args, timeout=timeout)


def main_output(capsys, *argv) -> tuple[int, str]:
    """``minicaffe ARGV`` in this process: (exit status, stdout and stderr)."""
    rc = cli.main(list(map(str, argv)))
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """A folder with ``data/digits`` (README's ``make_digits``) and ``d.json``, the profile
    SWAP.md's ``train --swap dynamic --auto-batch --save-profile`` line takes of the digits
    solver on the CPU (8 MiB: k_max 341; 30 iterations at 64; ``d.log`` its output).  Made
    once per session and shared by the pytest-xdist workers through a lock, as
    tests/conftest.py's tuner_quick_run is; tests only read it."""
    pytest.importorskip("lmdb")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "guide_digits"
    with open(root / "guide_digits.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (out / "d.json").exists():
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                from minicaffe.tools import make_digits
                make_digits.main(["--out", str(out / "data" / "digits")])
                (out / "prototxt").symlink_to(ROOT / "prototxt")
                line = guide_line("SWAP.md", "--auto-batch --save-profile")
                r = run(out, "-m", "minicaffe", *shortened(line, files={"r50.json": "d.json.tmp"}),
                        "--max-iter", "30")
                (out / "d.log").write_text(r.stdout + r.stderr)
                assert r.returncode == 0, r.stderr
                (out / "d.json.tmp").rename(out / "d.json")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


@pytest.fixture
def work(tmp_path, digits):
    """A folder of this test's own where the guides' relative paths hold: ``prototxt/``
    and ``data/`` link to the repository's nets and the session's digits data; snapshots
    land here (the digits solver's ``snapshots/digits/digits``)."""
    (tmp_path / "prototxt").symlink_to(ROOT / "prototxt")
    (tmp_path / "data").symlink_to(digits / "data")
    return tmp_path


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def guide_line(guide: str, *parts: str) -> str:
    """The one command of ``guide``'s ``sh`` blocks that holds every one of ``parts``."""
    found = [c for g, _, c in COMMANDS if g == guide and all(p in c for p in parts)]
    assert len(found) == 1, (parts, found)
    return found[0]


def shortened(text: str, files=(), budget="8M") -> list[str]:
    """The arguments of guide command ``text`` (without its program) for this CPU: `S` is
    the digits solver and `M` its net, `--gpu N` becomes `--cpu` and `--gpus a,b` as many
    CPU workers, a budget ``budget``, `--max-iter N` 3 iterations, each file of ``files``
    ({guide's name: path}) the path; the launcher gets a 30 s `--timeout`."""
    words = shlex.split(text)
    words = words[2:] if words[0].startswith("python") else words[1:]
    files = {"S": DIGITS, "M": DIGITS_NET, **{k: str(v) for k, v in dict(files).items()}}
    out, i = [], 0
    while i < len(words):
        w = words[i]
        if w == "--gpu":
            out.append("--cpu")
        elif w == "--gpus":
            out += ["--cpu-workers", str(len(words[i + 1].split(",")))]
        elif w in ("--budget", "--max-iter"):
            out += [w, budget if w == "--budget" else "3"]
        else:
            out.append(files.get(w, w))
            i += 1
            continue
        i += 2
    if "launch_ps" in text:
        dd = out.index("--") if "--" in out else len(out)
        out[dd:dd] = ["--timeout", "30"]
    return out


# ------------------------------------------------------------ PS.md: the launcher
def test_quick_start_two_shards_four_cpu_workers(work):
    """PS.md's quick start on CPU workers (3 iterations): the shards and ranks prefix their
    lines and write --log-dir, the values go through shared memory, only rank 0 tests, the
    display line and the snapshot files are the guide's."""
    cmd = guide_line("PS.md", "--cpu-workers 4")
    r = launch(work, *shortened(cmd), "--log-dir", "logs", "--", "--max-iter", "3",
               "--display", "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    out = r.stdout
    assert "gradients and parameters go through shared memory (--ps-shm" in out
    for name in ("shard0", "shard1", "rank0", "rank1", "rank2", "rank3"):
        assert f"[{name}] " in out and (work / "logs" / f"{name}.log").stat().st_size > 0
    assert {line.split()[0] for line in out.splitlines() if "Test net output" in line} == {
        "[rank0]"}
    assert re.search(r"\[rank2\] I\S* \S+ +\d+ ps\.worker\] Iteration 2, rank 2/4: Delta \(sync\) "
                     r"= [\d.]+ ms, compute = [\d.]+ ms, computation/communication = [\d.]+ "
                     r"\(mean of 1 iteration\(s\); [\d.e-]+ MB pushed", out), out[-2000:]
    made = {p.name for p in (work / "snapshots" / "digits").iterdir()}
    want = {"digits_shard0_iter_3.solverstate", "digits_shard1_iter_3.solverstate",
            "digits_iter_3.caffemodel", "digits_iter_3.solverstate"}
    want |= {f"digits_rank{r}_iter_3.{x}" for r in (1, 2, 3) for x in ("caffemodel",
                                                                       "solverstate")}
    assert made == want


def _digits_solver(work, max_iter, snapshot, prefix) -> str:
    """The digits solver with another max_iter, snapshot interval and prefix."""
    text = (ROOT / DIGITS).read_text()
    for field, value in (("max_iter", max_iter), ("snapshot", snapshot)):
        text = re.sub(rf"^{field}: \d+$", f"{field}: {value}", text, flags=re.M)
    text = re.sub(r'^snapshot_prefix: ".*"$', f'snapshot_prefix: "{prefix}"', text, flags=re.M)
    (work / "solver.prototxt").write_text(text)
    return "solver.prototxt"


def test_resume_auto_continues_the_digits_run_bit_for_bit(work):
    """`--resume auto` after a failure: every process restarts from the latest iteration
    all have, and the `Data` layer's read position comes back with the snapshot, so the
    model is the uninterrupted run's byte for byte, without a warning."""
    solver = _digits_solver(work, 6, 3, "snapshots/r/d")
    again = shortened(guide_line("PS.md", "--resume auto"), files={"S": solver})
    i = again.index("--resume")
    r = launch(work, *again[:i], *again[i + 2:])
    assert r.returncode == 0, r.stdout[-3000:]
    snap = work / "snapshots" / "r"
    whole = (snap / "d_iter_6.caffemodel").read_bytes()
    for f in snap.glob("*_iter_6.*"):
        f.unlink()
    r = launch(work, *again)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "resuming every local process from iteration 3" in r.stdout
    assert "cannot restore its read position" not in r.stdout
    assert (snap / "d_iter_6.caffemodel").read_bytes() == whole


DUMMY_NET = """name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""

HDF5_NET = """name: "h5"
layer { name: "data" type: "HDF5Data" top: "data" top: "target"
        hdf5_data_param { source: "train.txt" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def test_a_resumed_hdf5_layer_restarts_with_a_warning(tmp_path):
    """PS.md: `HDF5Data` keeps no read position, so resumed workers read from its first
    record again and, two of them, say so."""
    h5py = pytest.importorskip("h5py")
    import numpy as np
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["data"] = np.arange(64, dtype=np.float32).reshape(16, 4)
        f["target"] = np.ones((16, 2), np.float32)
    (tmp_path / "train.txt").write_text(f"{tmp_path / 'train.h5'}\n")
    (tmp_path / "net.prototxt").write_text(HDF5_NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 4\nsnapshot: 2\n'
        'snapshot_prefix: "snap/h"\nsolver_mode: CPU\nrandom_seed: 1\n')
    base = ["--solver", "solver.prototxt", "--cpu-workers", "2", "--timeout", "30"]
    r = launch(tmp_path, *base)
    assert r.returncode == 0 and "cannot restore" not in r.stdout, r.stdout[-3000:]
    r = launch(tmp_path, *base, "--resume", "2")
    assert r.returncode == 0, r.stdout[-3000:]
    warning = ("layer 'data' (HDF5Data) cannot restore its read position: the resumed run "
               "reads its data from the start")
    warned = sorted((line.split()[0], line.split()[1][0])     # ([rank0], its log level)
                    for line in r.stdout.splitlines() if warning in line)
    assert warned == [("[rank0]", "W"), ("[rank1]", "W")], r.stdout[-3000:]


def test_swap_dynamic_workers_take_a_profile_and_a_fixed_batch(work, digits, capsys,
                                                               monkeypatch):
    """PS.md's `-- ... --swap dynamic --budget 12G --profile r50.json --batch 96` with CPU
    workers (8 MiB, the digits profile): every rank trains at 96; without a profile, or
    with --auto-batch, train refuses before it joins, naming what it needs."""
    line = guide_line("PS.md", "launch_ps.py", "--swap dynamic")
    r = launch(work, *shortened(line, files={"r50.json": digits / "d.json"}))
    assert r.returncode == 0, r.stdout[-3000:]
    for rank in ("rank0", "rank1"):
        assert re.search(rf"\[{rank}\] .*AccUDNN decision: k\* = 96 ", r.stdout)
    monkeypatch.chdir(work)
    for extra in ([], ["--auto-batch", "--profile", digits / "d.json"]):
        rc, out = main_output(capsys, "train", "--solver", DIGITS, "--cpu", "--ps",
                              "tcp://127.0.0.1:9", "--swap", "dynamic", "--budget", "12G", *extra)
        assert rc != 0 and "with --ps, --swap dynamic needs --profile P and a fixed k" in out
        assert "Traceback" not in out


def test_shards_and_workers_by_hand(work):
    """PS.md's pieces by hand (`--cpu` for `--gpu r`), each on a free port instead of 5600
    and 5601 (`--bind tcp://127.0.0.1:*`, `--endpoint-file`), shard 1 through `python -m ps
    server`: they train; the shards' `--stats` and the workers' `--ps-stats` hold the fields
    PS.md lists, and the shards' snapshots are where it says."""
    servers = [shortened(guide_line("PS.md", f"ps server --shard {s}")) for s in (0, 1)]
    workers = [shortened(guide_line("PS.md", f"--rank {r} --world-size 2")) for r in (0, 1)]
    binds = [argv[argv.index("--bind") + 1] for argv in servers]
    assert all(w[w.index("--ps") + 1] == ",".join(binds) for w in workers)
    procs = []
    try:
        for s, (argv, prog) in enumerate(zip(servers, (["-m", "minicaffe"], ["-m"]))):
            argv[argv.index("--bind") + 1] = "tcp://127.0.0.1:*"
            procs.append(subprocess.Popen(
                [sys.executable, *prog, *argv, "--endpoint-file", f"e{s}", "--timeout", "30",
                 "--stats", f"shard{s}.jsonl"], cwd=work, env=env(),
                stdout=subprocess.DEVNULL, stderr=open(work / f"shard{s}.log", "w")))
        deadline = time.monotonic() + 30
        while not all((work / f"e{s}").exists() for s in (0, 1)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        eps = [(work / f"e{s}").read_text().strip() for s in (0, 1)]
        assert all(re.fullmatch(r"tcp://127\.0\.0\.1:\d+", e) for e in eps), eps
        for rank, argv in enumerate(workers):
            argv[argv.index("--ps") + 1] = ",".join(eps)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "minicaffe", *argv, "--max-iter", "3", "--ps-stats",
                 f"rank{rank}.jsonl"], cwd=work, env=env(),
                stdout=subprocess.DEVNULL, stderr=open(work / f"rank{rank}.log", "w")))
        codes = [p.wait(60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "".join((work / f"{n}.log").read_text()[-1500:] for n in
                   ("shard0", "shard1", "rank0", "rank1"))
    assert codes == [0, 0, 0, 0], logs
    for s in (0, 1):
        rounds = jsonl(work / f"shard{s}.jsonl")
        assert [x["iteration"] for x in rounds] == [0, 1, 2]
        assert set(rounds[0]) >= {"iteration", "round_s", "wait_s", "update_s", "send_s",
                                  "last_rank", "tail_s", "spread_s", "rank_done_s", "start_t",
                                  "bytes_in", "bytes_out"}
        assert len(rounds[0]["rank_done_s"]) == 2
        assert (work / "snapshots" / "digits" / f"digits_shard{s}_iter_3.solverstate").exists()
    for rank in (0, 1):
        recs = jsonl(work / f"rank{rank}.jsonl")
        assert [x["iteration"] for x in recs] == [0, 1, 2]
        assert set(recs[0]) >= {"iteration", "compute_s", "delta_s", "bytes_pushed",
                                "bytes_pulled", "parts"}
        assert set(recs[0]["parts"]) >= {"push_s", "pull_wait_s", "copy_up_s", "early_mb",
                                         "last_push_t"}


def test_curve_keys_admit_the_hosts_given_a_client_pair(work, capsys):
    """`minicaffe ps keys --curve-dir keys [--clients N]` makes the files PS.md names; a
    worker host with `server.key` and a client pair (`client1`, under the name `client`)
    trains; one with a pair the shard never authorized is refused at once, and the shard
    logs it."""
    assert main_output(capsys, "ps", "keys", "--curve-dir", work / "keys", "--clients", 2)[0] == 0
    made = {str(p.relative_to(work / "keys")) for p in (work / "keys").rglob("*") if p.is_file()}
    assert made == {"server.key", "server.key_secret", "client.key", "client.key_secret",
                    "client1.key", "client1.key_secret", "authorized/client.key",
                    "authorized/client1.key"}
    assert main_output(capsys, "ps", "keys", "--curve-dir", work / "other")[0] == 0
    for host, pair in (("host", work / "keys" / "client1"),
                       ("stranger", work / "other" / "client")):
        (work / host).mkdir()
        shutil.copy(work / "keys" / "server.key", work / host / "server.key")
        shutil.copy(f"{pair}.key", work / host / "client.key")
        shutil.copy(f"{pair}.key_secret", work / host / "client.key_secret")
    shard = subprocess.Popen([sys.executable, "-m", "minicaffe", "ps", "server", "--shard", "0",
                              "--world-size", "1", "--endpoint-file", "e0", "--timeout", "30",
                              "--curve-dir", "keys"], cwd=work, env=env(),
                             stdout=subprocess.DEVNULL, stderr=open(work / "shard.log", "w"))
    try:
        deadline = time.monotonic() + 30
        while not (work / "e0").exists():
            assert time.monotonic() < deadline and shard.poll() is None
            time.sleep(0.05)
        train = ["-m", "minicaffe", "train", "--solver", DIGITS, "--cpu", "--max-iter", "2",
                 "--ps", (work / "e0").read_text().strip(), "--ps-timeout", "20"]
        t0 = time.monotonic()
        r = run(work, *train, "--curve-dir", "stranger")
        assert r.returncode != 0 and time.monotonic() - t0 < 15
        assert "refused the connection handshake (CURVE" in r.stderr, r.stderr[-2000:]
        r = run(work, *train, "--curve-dir", "host")
        assert r.returncode == 0, r.stderr[-2000:]
        assert shard.wait(30) == 0
    finally:
        if shard.poll() is None:
            shard.kill()
            shard.wait()
    assert "CURVE: refused a client" in (work / "shard.log").read_text()


def test_emulated_links_delay_both_directions_and_leave_shared_memory(work, capsys,
                                                                       monkeypatch):
    """PS.md's `--link-gbps 10 --link-latency-ms 0.1`, with 25 ms to be seen on a CPU: the
    launcher then moves values through the sockets, and each round's Delta holds a push and
    an answer, each L late; shared memory with link emulation is refused by the launcher
    and by train."""
    assert "`--link-gbps 10 --link-latency-ms 0.1`" in prose(GUIDES["PS.md"])
    r = launch(work, "--solver", DIGITS, "--cpu-workers", "1", "--timeout", "30",
               "--link-gbps", "10", "--link-latency-ms", "25", "--", "--max-iter", "3",
               "--ps-stats", "stats.jsonl")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "shared memory" not in r.stdout
    deltas = [x["delta_s"] for x in jsonl(work / "stats.jsonl")]
    assert len(deltas) == 3 and min(deltas) >= 0.9 * 2 * 0.025, deltas   # a push, an answer
    launch_ps = script("launch_ps")
    with pytest.raises(SystemExit, match="link emulation cannot delay"):
        launch_ps.main(["--solver", DIGITS, "--cpu-workers", "1", "--shm", "--link-gbps", "10",
                        "--dry-run"])
    monkeypatch.chdir(work)
    rc, out = main_output(capsys, "train", "--solver", DIGITS, "--cpu", "--ps",
                          "tcp://127.0.0.1:9", "--ps-shm", "--link-gbps", "10")
    assert rc != 0 and "--ps-shm moves the values through shared memory" in out


def test_the_commands_printed_for_other_nodes(tmp_path, capsys, monkeypatch):
    """PS.md's two-node line (`--dry-run`): keys made, the shards bind 0.0.0.0 from
    --port-base, node 0 runs ranks 0..3 and prints ranks 4..7 for node 1, the flags after
    `--` in both, no shared memory across hosts; one node's workers use it unless
    `--no-shm`."""
    monkeypatch.chdir(tmp_path)
    main, argv = entry_of(guide_line("PS.md", "--nodes 2"))
    assert main(argv + ["--dry-run", "--", "--max-iter", "200"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "keys" / "server.key_secret").exists()
    assert (tmp_path / "keys" / "authorized" / "client.key").exists()
    for s in range(4):
        assert f"--bind tcp://0.0.0.0:{5600 + s}" in out
    eps = ",".join(f"tcp://node0.example:{5600 + s}" for s in range(4))
    local, other = out.split("# on node 1:")
    for r in range(4):
        assert f"--ps {eps} --rank {r} --world-size 8" in local
        assert f"--rank {r + 4} --world-size 8 --gpu {r}" in other
    assert local.count("--max-iter 200") == 4 and other.count("--max-iter 200") == 4
    assert "--ps-shm" not in out
    for flags, shm in ((["--shards", "2", "--cpu-workers", "2"], True),
                       (["--shards", "2", "--cpu-workers", "2", "--no-shm"], False)):
        assert main(["--solver", "S", *flags, "--dry-run"]) == 0
        workers = [w for w in capsys.readouterr().out.splitlines() if " train " in w]
        assert len(workers) == 2 and all(("--ps-shm" in w) == shm for w in workers)


def test_gpu_only_flags_on_a_cpu(tmp_path, capsys, monkeypatch):
    """`--comm nccl` and `--gpu` refuse on a CPU naming what they need; `--cuda-graph` (and
    $MINICAFFE_CUDA_GRAPH) logs why the iterations run eagerly and trains on; the flags'
    choices and defaults are PS.md's table's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(DUMMY_NET)
    (tmp_path / "s.prototxt").write_text('net: "net.prototxt"\nbase_lr: 0.01\nmax_iter: 2\n'
                                         'lr_policy: "fixed"\nsolver_mode: CPU\n')
    comm = minicaffe_parser("train")._option_string_actions["--comm"]
    assert comm.choices == ["ps", "nccl"] and comm.default == "ps"
    assert "| `ps` (default) |" in GUIDES["PS.md"] and "NCCL all-reduce" in comm.help
    with pytest.raises(SystemExit, match="--comm nccl is for the GPUs of one node"):
        script("launch_ps").main(["--solver", "s.prototxt", "--cpu-workers", "2", "--comm",
                                  "nccl", "--dry-run"])
    rc, out = main_output(capsys, "train", "--solver", "s.prototxt", "--cpu", "--comm", "nccl",
                          "--ps", "tcp://127.0.0.1:9", "--world-size", "2")
    assert rc != 0 and "--comm nccl needs GPU mode (--gpu N)" in out
    rc, out = main_output(capsys, "train", "--solver", "s.prototxt", "--swap", "naive",
                          "--cuda-graph")
    assert rc == 0 and "runs its iterations eagerly under the swap plan: CPU mode" in out
    monkeypatch.setenv("MINICAFFE_CUDA_GRAPH", "1")
    rc, out = main_output(capsys, "train", "--solver", "s.prototxt", "--swap", "naive")
    assert rc == 0 and "runs its iterations eagerly under the swap plan: CPU mode" in out
    if importlib.util.find_spec("cupy") is None:
        rc, out = main_output(capsys, "train", "--solver", "s.prototxt", "--gpu", "0")
        assert rc != 0 and "GPU mode needs CuPy" in out


def test_ps_scaling_options_the_guide_names(tmp_path, capsys):
    """`ps_scaling.py` (`--dry-run`): `--links ipc` and `shm` are configurations of their
    own, shm's workers get `--ps-shm`, `--cuda-graph` goes to every worker, and on CPU
    workers `--comms alone` is skipped with a note."""
    ps_scaling = script("ps_scaling")
    assert ps_scaling.main(["--quick", "--dry-run", "--links", "none,ipc,shm", "--cuda-graph",
                            "--modes", "caffe_ps", "--gpus", "1", "--comms", "ps,alone",
                            "--work-dir", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "--comm alone skipped: CPU workers" in out
    rows = re.findall(r"^(\S+): k=\d+.*\n\s+(.*)$", out, flags=re.M)
    assert [name.split("_")[-2] for name, _ in rows] == ["none", "ipc", "shm"]
    assert all("--cuda-graph" in cmd and ("--ps-shm" in cmd) == (name.split("_")[-2] == "shm")
               for name, cmd in rows)


# ------------------------------------------------------------- SWAP.md: the tuner
def test_the_saved_profile_and_the_decision_log(digits):
    """SWAP.md's `train --swap dynamic --auto-batch --save-profile` (the fixture's run):
    the profile file holds section 1's fields; the minibatches are `profile_ks(k_max)`,
    each trained warm-up + 1 iterations; the decision's learning rate is eq. (9) with c = 1
    and the schedule keeps the number of images (section 5)."""
    from swap.lr import eq9
    from swap.profiler import Profile, profile_ks
    d = json.loads((digits / "d.json").read_text())
    log = (digits / "d.log").read_text()
    assert (d["schema"], d["version"]) == ("minicaffe.swap.profile", 1)
    assert set(d) >= {"net", "device", "mode", "date", "k_base", "ks", "steps", "compute",
                      "transfers", "iterations", "bandwidth", "meta"}
    assert set(d["steps"][0]) >= {"step", "layer", "type", "phase"}
    assert set(d["compute"][0]) >= {"k", "step", "flops", "time", "start"}
    assert set(d["transfers"][0]) >= {"k", "kind", "buffer", "nbytes", "time", "start",
                                      "concurrent"}
    assert {t["kind"] for t in d["transfers"]} == {"offload", "prefetch"}
    assert all(len(it) == 2 for it in d["iterations"]) and d["bandwidth"] is None
    assert set(d["meta"]) >= {"gmap", "test_net_bytes", "host_budget", "layout"}
    k_max = int(re.search(r"AccUDNN stage 1: profiling minibatches \[[\d, ]+\] under the naive "
                          r"plan \(k_max (\d+) at budget 8\.00 MiB", log).group(1))
    assert tuple(d["ks"]) == profile_ks(k_max)
    assert tuple(Profile.load(digits / "d.json").ks) == tuple(d["ks"])
    k = int(re.search(r"AccUDNN decision: k\* = (\d+) \(k_max", log).group(1))
    m = re.search(r"learning rate 0.01 at k_base 64 -> ([\d.]+) at k\* (\d+) \(rule eq9, "
                  r"convexity 1\); training to iteration (\d+) \(same number of images\)", log)
    assert m and int(m.group(2)) == k
    assert float(m.group(1)) == pytest.approx(eq9(0.01, k / 64), rel=1e-5)
    done = int(re.search(r"AccUDNN stage 3: training from iteration (\d+) at minibatch", log)
               .group(1))
    assert done == 2 * len(d["ks"])
    images_left = 30 * 64 - 2 * sum(d["ks"])
    assert int(m.group(3)) == done + math.ceil(images_left / k)


def test_swap_quick_start_on_the_saved_profile(work, digits, capsys, monkeypatch):
    """SWAP.md's quick start after the profile (the `digits` fixture ran its `--save-profile`
    line), at 8 MiB on the digits solver: `train ... --batch 96` profiles that k alone and
    keeps the number of images, here with a `--memory-trace`; `--auto-batch --profile`
    profiles nothing; then every `plan` line on the profile: its own GMAP by default, with
    or without the net file, and the k* the training run took; `--layout cpu` builds the
    net, `--batch` plans that k, `--plot t.png --trace run.csv` draws both timelines."""
    monkeypatch.chdir(work)
    files = {"r50.json": digits / "d.json"}
    line = guide_line("SWAP.md", "minicaffe train", "--batch 96")
    rc, out = main_output(capsys, *shortened(line), "--memory-trace", "run.csv", "--max-iter", 5)
    assert rc == 0, out[-3000:]
    assert "profiling minibatches [96] under the naive plan" in out and "k* = 96 (k_max" in out
    assert "training to iteration 4 (same number of images)" in out   # 2 + ceil(128 / 96)
    assert len(Path("run.csv").read_text().splitlines()) > 20
    line = guide_line("SWAP.md", "--auto-batch --profile")
    rc, out = main_output(capsys, *shortened(line, files=files), "--cpu", "--max-iter", 4)
    assert rc == 0 and "loaded from" in out and "Profiled minibatch" not in out
    logged = re.search(r"AccUDNN decision: k\* = (\d+) ", (digits / "d.log").read_text())[1]
    lines = [c for g, _, c in COMMANDS if g == "SWAP.md" and c.startswith("minicaffe plan")
             and "r50.json" in c]
    assert len(lines) == 5
    for line in lines:
        rc, out = main_output(capsys, *shortened(line, files=files))
        assert rc == 0, (line, out)
        if "--layout cpu" in line:
            assert "(cpu layout)" in out, line
        elif "--batch 96" not in line:
            assert "(device layout: the GMAP the profile's run decided on" in out, line
            assert f"k* = {logged} (k_max" in out, line
        if "--batch 96" in line:
            assert "k* = 96 (k_max" in out, line
        if "--plot t.png" in line:
            assert "timeline drawn to t.png" in out, line
            assert Path("t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_refuses_another_nets_or_solvers_profile(work, digits, capsys, monkeypatch):
    """SWAP.md: a profile's GMAP plans only its own net; another solver type builds the net
    from --model, and without one the error names both ways out (not a --layout the user
    never gave); --layout device refuses it.  In ``work``, where the digits net's data
    paths hold (it passed only after a test that had left the cwd there)."""
    monkeypatch.chdir(work)
    p = digits / "d.json"
    rc, out = main_output(capsys, "plan", "--model", ROOT / "prototxt/cifar10_quick/dummy.prototxt",
                          "--budget", "8M", "--profile", p)
    assert rc != 0 and "the profile's GMAP is of net 'DigitsLeNet'" in out
    rc, out = main_output(capsys, "plan", "--budget", "8M", "--profile", p, "--solver-type",
                          "Adam")
    assert rc != 0 and ("the profile's GMAP holds the history of solver type 'SGD', not "
                        "'Adam': give --solver-type SGD, or --model") in out
    rc, out = main_output(capsys, "plan", "--budget", "8M", "--profile", p, "--solver-type",
                          "Adam", "--layout", "device")
    assert rc != 0 and "holds the history of solver type 'SGD', not 'Adam'" in out
    rc, out = main_output(capsys, "plan", "--model", ROOT / DIGITS_NET, "--budget", "8M",
                          "--profile", p, "--solver-type", "Adam")
    assert rc == 0 and "(cpu layout)" in out


def test_profile_pinned_and_recompute_on_the_cpu(work, digits, capsys, monkeypatch):
    """`MINICAFFE_PROFILE_PINNED=1` profiles the ks below the largest with every map pinned
    (`meta["plans"]`); `--recompute LAYERS` on train and plan names what runs again, and
    `--recompute auto` what each set gave."""
    monkeypatch.chdir(work)
    monkeypatch.setenv("MINICAFFE_PROFILE_PINNED", "1")
    rc, out = main_output(capsys, "train", "--solver", DIGITS, "--cpu", "--swap", "dynamic",
                          "--budget", "8M", "--auto-batch", "--save-profile", "p.json",
                          "--max-iter", 30)
    assert rc == 0 and "with every feature map pinned where they fit" in out
    plans = [kind for _, kind in json.loads(Path("p.json").read_text())["meta"]["plans"]]
    assert plans[-1] == "naive" and set(plans[:-1]) == {"pinned"}
    monkeypatch.delenv("MINICAFFE_PROFILE_PINNED")
    rc, out = main_output(capsys, "train", "--solver", DIGITS, "--cpu", "--swap", "dynamic",
                          "--budget", "4M", "--batch", 128, "--profile", digits / "d.json",
                          "--recompute", "conv1", "--max-iter", 4)
    assert rc == 0 and "recomputed in backward: conv1 (" in out, out[-2000:]
    rc, out = main_output(capsys, "plan", "--budget", "4M", "--profile", digits / "d.json",
                          "--batch", 128, "--recompute", "auto")
    assert rc == 0 and "--recompute auto tried: nothing: k 128" in out


def test_the_synthetic_device_flags_are_its_defaults(capsys):
    """`--peak-flops 50T --x-half 5e8 --bandwidth 55G --both 101G` is the device `plan`
    assumes without them; `--delta s` adds s per iteration to images/s, `--ops` prints the
    plan's ops."""
    base = ["plan", "--model", ROOT / "prototxt/digits/dummy.prototxt", "--budget", "64M",
            "--batch", 256]
    rc, plain = main_output(capsys, *base)
    assert rc == 0
    assert main_output(capsys, *base, "--peak-flops", "50T", "--x-half", "5e8", "--bandwidth",
                       "55G", "--both", "101G") == (0, plain)
    rc, out = main_output(capsys, *base, "--delta", "0.01")
    assert "images/s with 10.000 ms between iterations" in out and out != plain
    rc, out = main_output(capsys, *base, "--ops")
    assert len(out.splitlines()) > len(plain.splitlines()) + 20 and " setup " in out


def _table_row(guide, header, name) -> list[str]:
    return md_table(GUIDES[guide], header)[name]


def _stated(guide, start, **values) -> list[str]:
    """The arguments of the inline command of ``guide`` that starts with ``start``, its
    optional groups left out and its placeholders (`<net>`, `k`) given ``values``."""
    line = next(s for s in spans(GUIDES[guide]) if s.startswith(start))
    words = re.sub(r"\[[^\]]*\]", "", line).split()[1:]
    return [values.get(w, w).replace("<net>", values["net"]) for w in words]


def test_plan_on_resnet50_is_the_quick_starts_line_and_table_1s_row(tmp_path, capsys,
                                                                    monkeypatch):
    """SWAP.md's first command (`plan --model prototxt/resnet50/dummy.prototxt --budget 12G
    --plot r50.png`) draws its timeline and says section 7's k_max, k* and images/s."""
    line = guide_line("SWAP.md", "--plot r50.png")
    monkeypatch.chdir(ROOT)
    rc, out = main_output(capsys, *shlex.split(line)[1:-1], tmp_path / "r50.png")
    assert rc == 0 and (tmp_path / "r50.png").stat().st_size > 0, out
    row = _table_row("SWAP.md", "| net | k_max (naive)", "ResNet-50")
    m = re.search(r"k\* = (\d+) \(k_max (\d+) .*\n.* ([\d.]+) images/s", out)
    assert (m[2], m[1], str(round(float(m[3])))) == (row[1], row[2], row[4]), out


def test_table_1s_command_gives_its_row(capsys, monkeypatch):
    """Section 7's own command (`--no-fill`) on ResNet-50: the row's k*, k_max and pinned
    count."""
    monkeypatch.chdir(ROOT)
    row = _table_row("SWAP.md", "| net | k_max (naive)", "ResNet-50")
    argv = _stated("SWAP.md", "minicaffe plan --model prototxt/<net>/", net="resnet50")
    assert "--no-fill" in argv
    rc, out = main_output(capsys, *argv)
    assert rc == 0
    pinned, total = row[5].split(" / ")
    assert f"k* = {row[2]} (k_max {row[1]} " in out
    assert f"feature maps: {pinned} of {total} pinned" in out


def test_mem_on_resnet50_is_the_tables_rows(capsys, monkeypatch):
    """`minicaffe mem --model prototxt/resnet50/dummy.prototxt --batch 64 --budget 12G`: the
    smallest budgets and max k of section 9's row, Caffe's max k of section 7's."""
    monkeypatch.chdir(ROOT)
    argv = _stated("SWAP.md", "minicaffe mem --model prototxt/<net>/", net="resnet50", k="64")
    rc, out = main_output(capsys, *argv)
    assert rc == 0
    got = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in ("caffe", "none", "naive", "vdnn", "recompute"):
            arena = re.findall(r"([\d.]+) (GiB|MiB)", line)[-1]
            got[words[0]] = (float(arena[0]) / (1024 if arena[1] == "MiB" else 1), words[-1])
    row = _table_row("SWAP.md", "| net @ k | none", "ResNet-50 @ 64")
    for i, s in enumerate(("none", "naive", "vdnn", "recompute")):
        assert f"{got[s][0]:.2f}" == row[1 + i].split()[0], (s, got[s], row)
    assert row[6] == " / ".join(got[s][1] for s in ("none", "naive", "vdnn", "recompute"))
    assert got["caffe"][1] == _table_row("SWAP.md", "| net | k_max (naive)", "ResNet-50")[6]


def test_recompute_lines_on_a_saved_gpu_profile(capsys, monkeypatch):
    """Section 10's `plan ... --profile vgg16.json --recompute auto --k-objective largest`,
    on the VGG-16 H200 profile saved in docs/results: conv1_1 is what the tuner can
    recompute, and the log lists what each set gave."""
    monkeypatch.chdir(ROOT)
    line = guide_line("SWAP.md", "--recompute auto")
    argv = [w.replace("vgg16.json", "docs/results/tuner_s7/vgg16_profile.json")
            for w in shlex.split(line)[1:]]
    rc, out = main_output(capsys, *argv)
    assert rc == 0, out
    assert "--recompute auto tried: nothing: k " in out and "; conv1_1: k " in out
    assert "recomputed in backward: conv1_1 (" in out


def test_the_learning_rate_rules():
    """Section 5: eq. (9) with c = 1 gives 0.216 for ResNet-101 at 592 over 256 at 0.1;
    `--lr-rule linear` is alpha q, `sqrt` alpha sqrt(q)."""
    from swap.lr import LR_RULES, scale_lr
    text = prose(GUIDES["SWAP.md"])
    assert "total minibatch of 592 (table 2) gives 0.216" in text
    assert round(scale_lr(0.1, 592, 256), 3) == 0.216
    assert scale_lr(0.1, 512, 256, "linear") == pytest.approx(0.2)
    assert scale_lr(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert set(LR_RULES) == set(re.search(r"`--lr-rule \{([\w,]+)\}`", text)[1].split(","))
