"""README.md's command lines against the real argument parsers, without running anything.

Every ``minicaffe ...`` and ``python -m minicaffe.tools.X ...`` line of README.md's bash
blocks is parsed by the parser that the command itself builds (``minicaffe.cli.main``, each
tool's ``main``), stopped right after its ``parse_args``: a renamed or removed flag, a
changed choice or a new required argument fails here, naming the README line.  The flags
that the bash blocks' comments and the text's inline commands (`` `test -phase TRAIN` ``)
mention are checked to be options of their command.

README's notation is expanded before parsing: ``[...]`` is an optional group (dropped in one
variant, kept in the others), ``a | b`` inside a group and ``a|b`` inside a word are
alternatives (variant i takes the i-th, or the last), ``...`` stands for more arguments and
is dropped, and the placeholders of integer values (PLACEHOLDERS) get a number.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from minicaffe import cli

README = Path(__file__).resolve().parents[1] / "README.md"
TOOLS = "python -m minicaffe.tools."
# README's placeholders where the parser wants an integer (-resize_height H, --batch k)
PLACEHOLDERS = {"H": "256", "W": "256", "k": "128"}
# options of the commands, dashes at the start of a word: -gpu, --max-iter, -sigint_effect
FLAG = re.compile(r"(?<![\w./'-])(--?[A-Za-z][\w-]*)")


# ----------------------------------------------------------------- README.md's commands
def bash_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line inside a ```bash block."""
    out, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        fence = line.strip()
        if fence.startswith("```"):
            inside = not inside and fence == "```bash"
            continue
        if inside:
            out.append((n, line))
    return out


def split_comment(line: str) -> tuple[str, str]:
    """``code  # comment`` -> (code, comment); a ``#`` starts a comment at a word's start."""
    m = re.search(r"(?:^|\s)#", line)
    return (line, "") if m is None else (line[:m.start()], line[m.end():])


def commands(text: str) -> list[dict]:
    """The minicaffe and tool commands of the bash blocks, each with the flags that its
    comment lines mention (the lines of ``#`` that follow it)."""
    found, last = [], None
    for n, line in bash_lines(text):
        code, comment = split_comment(line)
        if code.strip():
            last = None
        for segment in (s.strip() for s in code.split("&&")):
            if segment.startswith("minicaffe ") or segment.startswith(TOOLS):
                last = {"line": n, "text": segment, "comment_flags": []}
                found.append(last)
        if comment and last is not None and last["text"].startswith("minicaffe "):
            last["comment_flags"] += FLAG.findall(comment)
    return found


def variants(text: str) -> list[list[str]]:
    """The argument lists that README's notation in ``text`` stands for (module docstring)."""
    group = re.compile(r"\[([^\[\]]*)\]")
    counts = ([len(g.split(" | ")) for g in group.findall(text)]
              + [len(w.split("|")) for w in text.split() if "|" in w])
    out = []
    for v in [None] + list(range(max(counts, default=1))):   # None: no optional group
        def pick(alternatives, v=v):
            return alternatives[min(v or 0, len(alternatives) - 1)]
        line = group.sub(lambda m: "" if v is None else pick(m.group(1).split(" | ")), text)
        argv = [pick(w.split("|")) if "|" in w else w for w in shlex.split(line)]
        argv = [PLACEHOLDERS.get(w, w) for w in argv if w != "..."]
        if argv not in out:
            out.append(argv)
    return out


def inline_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, words) of the text's inline commands outside the code blocks:
    `` `minicaffe train --cuda-graph` ``, `` `caffe time -weights W` `` (Caffe's lines run
    as typed), `` `test -phase TRAIN` ``, `` `python -m minicaffe.tools.detect` ``."""
    subcommands = set(_subparsers(cli.build_parser()))
    out, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            inside = not inside
            continue
        if inside:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            words = span.split()
            if words and words[0] in ("minicaffe", "caffe"):
                words = words[1:]
            if span.startswith(TOOLS) or (len(words) > 1 and words[0] in subcommands):
                out.append((n, words))
    return out


# ------------------------------------------------------------------ the real parsers
class Parsed(Exception):
    """Raised in place of running a command, once its parser has read the line."""


def parse_only(monkeypatch, entry, argv) -> tuple[bool, str]:
    """Whether ``entry(argv)`` (a command's main) gets past its top-level ``parse_args``
    (subcommands parse inside it), and argparse's message where it does not."""
    real = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    err = io.StringIO()
    with monkeypatch.context() as m, contextlib.redirect_stderr(err):
        m.setattr(argparse.ArgumentParser, "parse_args", stop)
        try:
            rc = entry(argv)
        except Parsed:
            return True, ""
        except SystemExit as e:
            rc = e.code
    return False, f"exit {rc}: {err.getvalue().strip()}"


def entry_of(text: str):
    """(main, argv without the command's own name) of a README command."""
    words = text.split(None, 3)
    if text.startswith(TOOLS):
        module = words[2]
        return importlib.import_module(module).main, (words[3] if len(words) > 3 else "")
    return cli.main, text.split(None, 1)[1]


def _subparsers(parser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def is_option(parser, flag: str) -> bool:
    """``flag`` (``-f=v`` or ``-f``) names an option of ``parser``: exactly, or as the one
    option it abbreviates (argparse's allow_abbrev; the README's ``-iter 5``)."""
    name = flag.split("=", 1)[0]
    options = parser._option_string_actions
    if name in options:
        return True
    return parser.allow_abbrev and sum(o.startswith(name) for o in options) == 1


def check_line(monkeypatch, text: str) -> list[str]:
    """The README command ``text`` parsed in each of its variants: the failures."""
    main, rest = entry_of(text)
    prog = text[:len(text) - len(rest)].strip()
    failed = []
    for argv in variants(rest):
        ok, why = parse_only(monkeypatch, main, argv)
        if not ok:
            failed.append(f"{prog} {shlex.join(argv)}: {why}")
    return failed


TEXT = README.read_text()
COMMANDS = commands(TEXT)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"L{c['line']}" for c in COMMANDS])
def test_readme_command_parses(cmd, monkeypatch):
    failed = check_line(monkeypatch, cmd["text"])
    assert not failed, f"README.md line {cmd['line']}: " + "; ".join(failed)


def test_readme_comment_flags_are_options():
    """The flags the usage block's comments name (train's solver flags, --max-batch,
    --host-budget, --layout ...) are options of some minicaffe command (a comment may name
    another command's flag: plan's line cites train's --save-profile)."""
    subs = _subparsers(cli.build_parser())
    unknown = [(c["line"], f) for c in COMMANDS for f in c["comment_flags"]
               if not any(is_option(p, f) for p in subs.values())]
    assert not unknown, f"flags in README.md comments that no minicaffe command takes: {unknown}"


def test_readme_inline_commands(monkeypatch):
    """The text's inline commands: each flag is an option of its command; a whole tool
    line parses, a bare tool name is a module."""
    subs = _subparsers(cli.build_parser())
    bad = []
    for n, words in inline_commands(TEXT):
        if " ".join(words).startswith(TOOLS):
            module = words[2]
            if importlib.util.find_spec(module) is None:
                bad.append(f"line {n}: no module {module}")
            elif len(words) > 3 and "..." not in words:
                bad += [f"line {n}: {f}" for f in check_line(monkeypatch, " ".join(words))]
            continue
        parser = subs[words[0]]
        if words[0] == "ps" and len(words) > 1 and words[1] in _subparsers(parser):
            parser = _subparsers(parser)[words[1]]
        bad += [f"line {n}: {words[0]} {w}" for w in words[1:]
                if FLAG.fullmatch(w.split("=", 1)[0]) and not is_option(parser, w)]
    assert not bad, "README.md inline commands with options their command lacks: " + "; ".join(bad)


def test_readme_has_the_commands_it_is_known_to_have():
    """The extraction still finds README's commands (a changed fence or prefix would make
    the tests above pass on nothing)."""
    assert sum(c["text"].startswith("minicaffe ") for c in COMMANDS) >= 15
    assert sum(c["text"].startswith(TOOLS) for c in COMMANDS) >= 9
    assert {c["text"].split()[1] for c in COMMANDS if c["text"].startswith("minicaffe ")} >= {
        "train", "test", "time", "device_query", "draw", "mem", "plan", "ps"}
    assert len(inline_commands(TEXT)) >= 5
    assert any("--random-seed" in c["comment_flags"] for c in COMMANDS)


@pytest.mark.parametrize("line", [
    "minicaffe train --solver S.prototxt --max-iters 100",          # a renamed flag
    "minicaffe train --solver S --swap naive|bogus --budget 12G",   # a choice in variant 1
    "minicaffe time --model NET.prototxt [--gpu 0 | --cpus]",       # in an optional group
    "minicaffe plan --budget 12G --batch k --bogus",
    "python -m minicaffe.tools.convert_imageset -grey ROOTFOLDER/ LISTFILE DB_NAME",
    "python -m minicaffe.tools.parse_log train.log",                # a positional missing
])
def test_a_wrong_readme_line_fails(line, monkeypatch):
    """The checks above can fail: lines as a README edit or a renamed flag would leave them."""
    assert check_line(monkeypatch, line)
    text = f"```bash\n{line}\n```\n"
    assert [c["text"] for c in commands(text)] == [line]


def test_variants_expand_readme_notation():
    assert variants("--solver S [--weights W.caffemodel | --snapshot S.solverstate] "
                    "[--gpu 0 | --cpu]") == [
        ["--solver", "S"],
        ["--solver", "S", "--weights", "W.caffemodel", "--gpu", "0"],
        ["--solver", "S", "--snapshot", "S.solverstate", "--cpu"]]
    assert variants("--swap naive|vdnn --budget 12G ...") == [
        ["--swap", "naive", "--budget", "12G"], ["--swap", "vdnn", "--budget", "12G"]]
    assert variants("x.npy out --mean_file mean.npy|'' -resize_height H") == [
        ["x.npy", "out", "--mean_file", "mean.npy", "-resize_height", "256"],
        ["x.npy", "out", "--mean_file", "", "-resize_height", "256"]]


def test_the_scripts_named_with_quick_are_those_that_have_it():
    """README's layout table names the scripts that take ``--quick``: exactly those whose
    parser has the flag (six were missing once)."""
    text = README.read_text()
    m = re.search(r"`--quick` \([^)]*\) in ((?:`\w+\.py`(?:, | and )?)+)", text)
    assert m, "README's layout table no longer lists the scripts with --quick"
    named = set(re.findall(r"`(\w+\.py)`", m.group(1)))
    scripts = Path(README).parent / "scripts"
    have = {p.name for p in scripts.glob("*.py") if '"--quick"' in p.read_text()}
    assert named == have, (f"README names {sorted(named - have)} that lack --quick and leaves "
                           f"out {sorted(have - named)}")
