"""Every shell and Python block of README.md and docs/*.md runs as written.

Blocks fenced ```bash, ```sh, ```console or ```python are extracted; each is one test, id ``FILE:LINE`` (the line
of its opening fence). How they run:

- Working directory: one fresh temporary directory per Markdown file, holding ``data`` — a symlink to the
  repository's shipped ``data/`` — so ``data/meuse/meuse.csv`` reads as it does from the repository root, and
  everything a block writes stays in the temporary directory. ``HOME`` is a directory inside it, so ``~`` paths and
  user configuration files (``~/.config/dask``) are sandboxed. The blocks of one file run there in order, so later
  blocks use earlier outputs; a block selected alone (``-k``) first runs the earlier blocks of its file.
- Shell (bash, sh): the block as a script, ``bash -e -o pipefail``. Console: its ``$ `` lines, the rest is output.
- Python: written to a file and run as ``python block.py`` — a script, not ``exec``: a script that starts Dask
  worker processes needs its ``if __name__ == "__main__":`` guard, as a user's does.
- ``PATH`` starts with this interpreter's directory, so ``spatialfed`` and ``python`` are the tested installation.

Markers — an HTML comment on a line of its own right before the fence (several may be stacked):

- ``<!-- docs-test: skip (REASON) -->``: not run, REASON required (needs a SLURM cluster, a remote address,
  ``pip install``); keep these few.
- ``<!-- docs-test: slow -->``: a long block, run under ``pytest -m slow`` only.
- ``<!-- docs-test: slurm -->``: submits batch jobs: runs against the local SLURM (.ci/slurm-up, tests/slurm.py);
  skipped with the reason where none runs, a failure then when SPATIALFED_REQUIRE_SLURM=1 (as CI sets it).
- ``<!-- docs-test: synopsis (REASON) -->``: an API synopsis (signatures with ``->``, alternatives with ``|``: not a
  program): only its import lines run, so every module and name it documents must exist.
- ``<!-- docs-test: file NAME -->``: on a block of any language (e.g. yaml): its text is written to NAME in the
  working directory before the blocks after it run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import site
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import slurm

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"bash": "shell", "sh": "shell", "shell": "shell", "console": "console", "python": "python",
             "py": "python"}
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>[a-z]+)\s*(?P<arg>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```+\s*(?P<lang>[\w+-]*)")
TIMEOUT_S = 1200


@dataclass
class Block:
    doc: Path
    line: int                  # 1-based line of the opening fence
    lang: str                  # the fence's language, lower case
    text: str
    markers: dict = field(default_factory=dict)   # kind -> argument ("skip" -> reason, "file" -> name, ...)

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str | None:
        return RUN_LANGS.get(self.lang)


def extract_blocks(doc: Path) -> list[Block]:
    """The fenced blocks of a Markdown file with their markers (the comments on the lines right before the fence)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(m["indent"]):] if lines[i].startswith(m["indent"]) else lines[i])
            i += 1
        markers, k = {}, start - 1
        while k >= 0 and (mk := MARKER.match(lines[k])):
            markers[mk["kind"]] = mk["arg"]
            k -= 1
        blocks.append(Block(doc, start + 1, m["lang"].lower(), "\n".join(body) + "\n", markers))
        i += 1
    return blocks


def reason(arg: str) -> str:
    """The text of a marker's '(REASON)'; empty when none is given."""
    m = re.fullmatch(r"\((.*)\)", arg.strip())
    return m.group(1).strip() if m else ""


ALL = [b for doc in DOCS for b in extract_blocks(doc)]
RUNNABLE = [b for b in ALL if b.kind is not None]


def _param(b: Block):
    marks = [pytest.mark.slow] if "slow" in b.markers else []
    return pytest.param(b, id=b.id, marks=marks)


# --- running ------------------------------------------------------------------------------------------------------
def import_lines(text: str) -> str:
    """The top-level import statements of a synopsis (comments dropped, parenthesised continuations joined)."""
    out, open_parens = [], 0
    for line in text.splitlines():
        code = line.split("#", 1)[0].rstrip()
        if open_parens or re.match(r"(from\s+\S+\s+import\s|import\s)", code):
            out.append(code)
            open_parens += code.count("(") - code.count(")")
    return "\n".join(out) + "\n"


def console_commands(text: str) -> str:
    """The commands of a console block: its `$ ` lines (continued with a trailing backslash)."""
    cmds, cont = [], False
    for line in text.splitlines():
        if cont or line.startswith("$ "):
            cmds.append(line if cont else line[2:])
            cont = line.rstrip().endswith("\\")
    return "\n".join(cmds) + "\n"


class Workspace:
    """One Markdown file's working directory and which of its blocks have run there."""

    def __init__(self, doc: Path, root: Path):
        self.dir = root / re.sub(r"\W", "_", str(doc.relative_to(ROOT)))
        (self.dir / "home").mkdir(parents=True)
        (self.dir / "data").symlink_to(ROOT / "data", target_is_directory=True)
        self.done: dict[int, str | None] = {}   # line -> None (passed) or the failure

    def env(self) -> dict:
        env = dict(os.environ)
        env["HOME"] = str(self.dir / "home")
        env["PYTHONUSERBASE"] = site.getuserbase()   # packages installed with --user stay importable
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["MPLBACKEND"] = "Agg"
        env.pop("PYTEST_CURRENT_TEST", None)
        return env

    def run(self, b: Block) -> str | None:
        """Run block b here; None when it succeeded, else the failure (command, exit status, output tail)."""
        if "file" in b.markers:
            (self.dir / b.markers["file"]).write_text(b.text, encoding="utf-8")
        if b.kind is None or "skip" in b.markers or ("slurm" in b.markers and slurm.why_not() is not None):
            return None  # (a SLURM block's own test skips or fails with the reason)
        if b.kind == "python":
            script = self.dir / f"block_{b.line}.py"
            script.write_text(import_lines(b.text) if "synopsis" in b.markers else b.text, encoding="utf-8")
            cmd = [sys.executable, script.name]
        else:
            script = self.dir / f"block_{b.line}.sh"
            script.write_text(console_commands(b.text) if b.kind == "console" else b.text, encoding="utf-8")
            cmd = [shutil.which("bash") or "bash", "-e", "-o", "pipefail", script.name]
        # own session: on a timeout the whole process group goes (bash, spatialfed, its Dask workers)
        proc = subprocess.Popen(cmd, cwd=self.dir, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"{b.id} did not finish within {TIMEOUT_S} s"
        if proc.returncode != 0:
            tail = (out[-3000:] + "\n--- stderr ---\n" + err[-6000:]).strip()
            return f"{b.id} exited with status {proc.returncode} in {self.dir}:\n{tail}"
        return None


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    made: dict[Path, Workspace] = {}

    def get(doc: Path) -> Workspace:
        if doc not in made:
            made[doc] = Workspace(doc, root)
        return made[doc]

    return get


# --- the tests ----------------------------------------------------------------------------------------------------
def test_blocks_are_found():
    """The extractor sees the README's blocks (a broken fence pattern would make every other test vanish)."""
    readme = [b for b in RUNNABLE if b.doc.name == "README.md"]
    assert {b.kind for b in readme} == {"shell", "python"}
    assert any("spatialfed fit" in b.text for b in readme)


@pytest.mark.parametrize("b", [pytest.param(b, id=b.id) for b in ALL if b.markers])
def test_markers_are_known_and_give_their_reason(b):
    assert set(b.markers) <= {"skip", "slow", "slurm", "synopsis", "file"}, \
        f"{b.id}: unknown docs-test marker {b.markers}"
    for kind in ("skip", "synopsis"):
        if kind in b.markers:
            assert reason(b.markers[kind]), f"{b.id}: write the reason: <!-- docs-test: {kind} (why) -->"
    if "file" in b.markers:
        assert re.fullmatch(r"[\w.-]+", b.markers["file"]), f"{b.id}: docs-test file needs a plain file name"
    if "synopsis" in b.markers:
        assert b.kind == "python" and import_lines(b.text).strip(), f"{b.id}: a synopsis is Python with imports"
    if b.kind is None:
        assert set(b.markers) <= {"file"}, f"{b.id}: only runnable blocks take skip/slow/slurm/synopsis markers"


@pytest.mark.parametrize("b", [_param(b) for b in RUNNABLE])
def test_block_runs_as_written(b, workspaces, request):
    if "skip" in b.markers:
        pytest.skip(reason(b.markers["skip"]))
    if "slurm" in b.markers:
        request.getfixturevalue("slurm")  # skips without SLURM, fails so when it is required
    ws = workspaces(b.doc)
    # earlier blocks write what later ones read; a synopsis only imports, so it is nobody's prerequisite
    earlier = [e for e in ALL if e.doc == b.doc and e.line < b.line and "synopsis" not in e.markers]
    for e in earlier:
        if e.line not in ws.done:
            ws.done[e.line] = ws.run(e)
    failed = [ws.done[e.line] for e in earlier if ws.done[e.line] is not None]
    if failed:
        pytest.fail("an earlier block of this file failed, so this one cannot run:\n" + failed[0][:2000])
    if b.line not in ws.done:
        ws.done[b.line] = ws.run(b)
    if ws.done[b.line] is not None:
        pytest.fail(ws.done[b.line])


def test_synopsis_and_console_extraction():
    synopsis = ("from a.b import (c,   # c(x) -> y\n    d)\nx = f(a) -> int\n    from not_top import z\n"
                "import e  # e.g. (\nserver.t -> int\n")
    assert import_lines(synopsis) == "from a.b import (c,\n    d)\nimport e\n"
    console = "$ spatialfed fit s.zarr \\\n    --out f\nwrote f\n$ ls\nf\n"
    assert console_commands(console) == "spatialfed fit s.zarr \\\n    --out f\nls\n"
    marked = extract_blocks(ROOT / "docs" / "hpc.md")
    assert any(b.markers.get("file") == "jobs.yaml" and b.lang == "yaml" for b in marked)


def test_every_spec_reference_resolves_in_docs_spec():
    """Each "SPEC §N" cited in spatialfed/, docs/ or README.md names a section of docs/spec.md (the contracts live in
    the repository); a citation of a section that does not exist turns this red."""
    root = Path(__file__).resolve().parents[1]
    spec = (root / "docs" / "spec.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+[a-z]?)\.", spec, flags=re.M))
    assert {"1", "2", "2b", "2c", "3", "4", "5", "6", "7"} <= sections
    files = [*root.joinpath("spatialfed").rglob("*.py"), *root.joinpath("docs").glob("*.md"), root / "README.md"]
    cited = {(path.relative_to(root).as_posix(), ref) for path in files
             for ref in re.findall(r"SPEC §(\d+[a-z]?)", path.read_text(encoding="utf-8"))}
    assert len(cited) > 50  # the code cites it throughout
    assert not [(where, ref) for where, ref in cited if ref not in sections]
