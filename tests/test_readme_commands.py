"""Every command README.md, REPRODUCE.md and docs/ show runs as written (issues 47, 45):
``make test-readme``.

Their fenced ``bash`` blocks are read in order, README first (a command shown twice, inline
comments aside, runs once, where it is shown first); each line (backslash continuations joined) is
one command, run by bash in the repository root exactly as written, with only a budget-shrinking
suffix appended where :data:`SHRINK` names one (fewer updates, seeds or repetitions: never a
different command). A block right after an HTML comment ``<!-- needs: WHAT -->`` (a GPU, a
cluster, the internet, another venv) or ``<!-- skip: WHY -->`` is skipped, with that reason
printed. A command passes when it exits 0 and prints none of :data:`NOISE`. So a new fenced
command in any of them is run by this test without any change here.

Outside ``make test-readme`` (``EBRL_README_TEST=1``) every case is skipped: the commands take
minutes. The parsing is checked in the default run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the pages whose commands a user is told to run: README, REPRODUCE, then docs/ by name
PAGES = [README, ROOT / "REPRODUCE.md", *sorted((ROOT / "docs").glob("*.md"))]
#: the command that runs the cases (and the environment variable it sets)
ENABLE = "EBRL_README_TEST"

#: (pattern of a command, what shrinks its budget). A string is appended to the command; a dict
#: is given as environment variables (the Makefile's own knobs). The first match applies.
SHRINK: list[tuple[str, str | dict[str, str]]] = [
    (r"^make run\b", {"RUN_SEEDS": "0,1", "RUN_ITERS": "4", "RUN_CONFIGS": "async,ebrl"}),
    (r"-m ebrl\.train\b(?!.*--help)", " budget.iterations=1"),
    (r"-m ebrl\.plan\.measure\b", " --repeats 1 --batches 1,4 --sim-envs 2"),
    (r"-m ebrl\.plan\b.*--machine scale/", " --updates 2"),
    (r"^make plan\b", " ARGS='--updates 2'"),
]
#: what a good run must not print: a traceback, Ray's warning that it chose token auth itself,
#: torch's FSDP2 warning about a module that returned a view
NOISE = ("Traceback (most recent call last)", "Token authentication is enabled", "a view tensor")
#: seconds one command may take with its budget shrunk (a loaded 2-core machine: make run's 4
#: runs took over 15 min there)
TIMEOUT = 1800


@dataclass(frozen=True)
class Command:
    """One command of a page: its text, its line, why it is skipped (None: it runs), and the
    page (relative to the repository)."""

    text: str
    line: int
    skip: str | None
    page: str = "README.md"

    @property
    def key(self) -> str:
        """The command without its inline comment and extra spaces: the same command on two
        pages has one key."""
        return " ".join(self.text.partition("  #")[0].split())

    def shrunk(self) -> tuple[str, dict[str, str]]:
        """The command with its budget shrunk, and the environment variables that do it."""
        for pattern, how in SHRINK:
            if re.search(pattern, self.text):
                if isinstance(how, dict):
                    return self.text, how
                head, sep, comment = self.text.partition("  #")  # an inline comment stays last
                return head.rstrip() + how + (f"  #{comment}" if sep else ""), {}
        return self.text, {}


_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*(needs|skip):\s*(.*?)\s*-->\s*$")


def readme_commands(text: str, page: str = "README.md") -> list[Command]:
    """The commands of ``text``'s fenced bash blocks, each with its block's skip reason."""
    out: list[Command] = []
    lines = text.splitlines()
    mark: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _MARK.match(line)
        if m:
            mark = f"needs {m.group(2)}" if m.group(1) == "needs" else m.group(2)
        elif (f := _FENCE.match(line)) and f.group(1) in ("bash", "sh", "shell"):
            i += 1
            pending, start = "", 0
            while i < len(lines) and not lines[i].startswith("```"):
                body = lines[i]
                if body.strip() and not body.lstrip().startswith("#"):
                    if not pending:
                        start = i + 1
                    if body.rstrip().endswith("\\"):
                        pending += body.rstrip()[:-1].rstrip() + " "
                    else:
                        out.append(Command((pending + body.strip()).strip(), start, mark, page))
                        pending = ""
                i += 1
            mark = None
        elif line.startswith("```"):  # another language's block: skip to its end
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            mark = None
        elif line.strip():
            mark = None  # a marker belongs to the block right after it
        i += 1
    return out


def page_commands(pages: list[Path]) -> list[Command]:
    """Every page's commands in order, each command once (where it is first shown)."""
    out: list[Command] = []
    seen: set[str] = set()
    for path in pages:
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        for cmd in readme_commands(path.read_text(), name):
            if cmd.key not in seen:
                seen.add(cmd.key)
                out.append(cmd)
    return out


COMMANDS = page_commands(PAGES)
_RESULTS: list[tuple[str, str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def report():
    """After the cases: every command with what happened to it, and the time."""
    t0 = time.perf_counter()
    yield
    if not _RESULTS:
        return
    ran = [r for r in _RESULTS if r[0] != "skipped"]
    print(f"\n\nREADME commands: {len(ran)} run, {len(_RESULTS) - len(ran)} skipped")
    for what, text, secs in _RESULTS:
        print(f"  {what:>8} {secs:6.0f} s  {text}" if what != "skipped" else f"  {text}")
    print(f"README commands: {time.perf_counter() - t0:.0f} s in all")


def test_readme_has_commands_and_every_marker_belongs_to_a_block():
    """The parser finds the commands (continuations joined), and a marker not followed by a
    fenced block is an error, not a silently ignored line."""
    assert len(COMMANDS) >= 10
    assert any(c.text.startswith("make run") for c in COMMANDS)
    assert all("\\" not in c.text for c in COMMANDS)
    sample = "<!-- needs: a GPU -->\n```bash\nmake a \\\n  B=1  # x\nmake b\n```\n```bash\nc\n```\n"
    got = readme_commands(sample)
    assert [(c.text, c.skip) for c in got] == [
        ("make a B=1  # x", "needs a GPU"),
        ("make b", "needs a GPU"),
        ("c", None),
    ]
    assert Command("make a B=1  # x", 1, None).shrunk() == ("make a B=1  # x", {})
    train = Command(".venv/bin/python -m ebrl.train seed=3  # note", 1, None)
    assert train.shrunk() == (
        ".venv/bin/python -m ebrl.train seed=3 budget.iterations=1  # note",
        {},
    )
    for page in PAGES:
        text = page.read_text().splitlines()
        for n, line in enumerate(text):
            if _MARK.match(line):
                nxt = next(x for x in text[n + 1 :] if x.strip())
                where = f"{page.relative_to(ROOT)} line {n + 1}"
                assert _FENCE.match(nxt), f"{where}: a marker not before a fenced block"


def test_every_page_a_user_reads_is_covered_and_a_repeated_command_runs_once(tmp_path):
    """The docs' commands are run too (README links to them), and a command shown on two
    pages, whatever its comment, runs once: where it is shown first."""
    assert {c.page for c in COMMANDS} >= {"README.md", "REPRODUCE.md", "docs/launchers.md"}
    keys = [c.key for c in COMMANDS]
    assert len(keys) == len(set(keys))
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text("```bash\nmake x   # one\nmake y\n```\n")
    b.write_text("<!-- skip: no -->\n```bash\nmake x  # two\nmake z\n```\n")
    got = [(Path(c.page).name, c.text, c.skip) for c in page_commands([a, b])]
    assert got == [
        ("a.md", "make x   # one", None),
        ("a.md", "make y", None),
        ("b.md", "make z", "no"),
    ]


def _no_reinstall(cmd: str, env: dict[str, str]) -> None:
    """A make target here must not set the venv up again (pip into a shared venv)."""
    m = re.match(r"make\s+(.*?)(\s+#.*)?$", cmd)
    if not m:
        return
    dry = subprocess.run(
        f"make -n {m.group(1)}", shell=True, cwd=ROOT, env=env, capture_output=True, text=True
    )
    if "pip install" in dry.stdout:
        pytest.fail(f"`{cmd}` would install into {ROOT / '.venv'}: run `make setup` first")


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.page}:L{c.line}" for c in COMMANDS])
def test_readme_command_runs_as_written(cmd: Command):
    if os.environ.get(ENABLE) != "1":
        pytest.skip(f"the README commands run in `make test-readme` ({ENABLE}=1)")
    if cmd.skip is not None:
        _RESULTS.append(("skipped", f"skipped ({cmd.skip}): {cmd.text}", 0.0))
        pytest.skip(f"{cmd.page} line {cmd.line}: {cmd.skip}")
    text, extra = cmd.shrunk()
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop(ENABLE, None)
    env.pop("RAY_AUTH_MODE", None)  # as a user's shell has it
    _no_reinstall(text, env)
    shown = " ".join(f"{k}={v}" for k, v in extra.items()) + (" " if extra else "") + text
    print(f"\n$ {shown}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["bash", "-c", text],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends all of it
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # ebrl's runs stop cleanly on it
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        _RESULTS.append(("TIMEOUT", shown, time.perf_counter() - t0))
        pytest.fail(f"{cmd.page} line {cmd.line}: not done in {TIMEOUT} s\n{out[-4000:]}")
    secs = time.perf_counter() - t0
    print("\n".join(out.splitlines()[-8:]), flush=True)
    noise = [n for n in NOISE if n in out]
    _RESULTS.append(("passed" if proc.returncode == 0 and not noise else "FAILED", shown, secs))
    assert proc.returncode == 0, (
        f"{cmd.page} line {cmd.line}: exit {proc.returncode}\n{out[-4000:]}"
    )
    assert not noise, f"{cmd.page} line {cmd.line}: printed {noise}\n{out[-4000:]}"
