"""The README and docs/ hold only code that works (issue 28, item 2).

- Every ```python block of README.md and docs/*.md runs alone in a fresh Python process, as it
  runs when pasted into a new script (cwd a temporary directory; no test set-up: x64 off, one
  CPU device until the block asks for more, FMA as on the user's machine). A block that takes
  more than a few seconds is marked by a ``<!-- test: slow -->`` line right before its fence
  and runs in the slow tier.
- Every ```toml block parses; every one with a ``[model]`` table (a complete experiment file)
  runs for 2 steps through ``simpar run``.
- A block that is deliberately a fragment starts with the line ``# fragment`` and is skipped.
  A block preceded by ``<!-- test: tests/NAME.py -->`` is run by that test file (e.g. with
  the test set-up's FMA off, to check a bitwise claim) and not twice; nothing else is skipped.
- docs/models.md is what ``simpar keys all`` prints.
- Every relative link of the pages reaches a file, and its ``#anchor`` a heading there.
- No tracked file holds an absolute path of a machine (a path under /tmp, /work, /root,
  /home, /Users or /scratch).
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from simpar.cli import main
from simpar.testing import user_shell_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SLOW_MARK = "<!-- test: slow -->"
RUN_BY = re.compile(r"<!-- test: (tests/\w+\.py) -->")


def _blocks(lang: str) -> list:
    """``pytest.param(code, ...)`` for every ```lang block of the pages, with its marks."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in (m for m in FENCE.finditer(text) if m.group(1) == lang):
            code = m.group(2)
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marks = [pytest.mark.slow] if before.strip() == SLOW_MARK else []
            line = text[: m.start()].count("\n") + 1
            name = f"{page.relative_to(ROOT)}:{line}"
            if code.startswith("# fragment"):
                marks.append(pytest.mark.skip(reason="marked '# fragment'"))
            elif (by := RUN_BY.fullmatch(before.strip())) is not None:
                assert (ROOT / by.group(1)).is_file(), f"{name}: {by.group(1)} does not exist"
                marks.append(pytest.mark.skip(reason=f"run by {by.group(1)}"))
            out.append(pytest.param(code, id=name, marks=marks))
    return out




def test_the_pages_have_code_blocks():
    assert len(_blocks("python")) >= 8 and len(_blocks("toml")) >= 2


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_block_runs_alone_in_a_fresh_process(code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=user_shell_env(ROOT),
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, f"{code}\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("code", _blocks("toml"))
def test_toml_block_parses_and_a_complete_experiment_runs(code, tmp_path, capsys):
    data = tomllib.loads(code)
    if "model" not in data:
        return  # a table to add to an experiment (e.g. [ensemble]): parsing is the check
    from simpar.models import available

    if code.startswith("# file: ") and data["model"].get("name") not in available():
        pytest.skip("a plugin's experiment: tests/test_plugin.py installs the plugin and runs it")
    path = tmp_path / "experiment.toml"
    path.write_text(code)
    suffix = ".h5md" if data["model"].get("name") in ("lj", "nbody") else ".nc"
    out = tmp_path / ("out" + suffix)
    code = main(["run", str(path), "--steps", "2", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert out.exists()


@pytest.mark.parametrize("model", ["heat", "lbm", "lj", "nbody", "spectral_ns"])
def test_models_md_is_what_simpar_keys_prints(model):
    """Regenerating docs/models.md gives the file (per model here; the whole document, with
    the other models, in the slow tier)."""
    from simpar.drive import keys

    text = (ROOT / "docs" / "models.md").read_text()
    section = keys.markdown(model)
    assert section in text, (
        f"docs/models.md is stale for {model}: run `.venv/bin/simpar keys all > docs/models.md`"
    )


@pytest.mark.slow
def test_models_md_is_simpar_keys_all(capsys):
    assert main(["keys", "all"]) == 0
    printed = capsys.readouterr().out
    assert printed == (ROOT / "docs" / "models.md").read_text(), (
        "docs/models.md is stale: run `.venv/bin/simpar keys all > docs/models.md`"
    )


def test_keys_names_what_a_reader_checks(capsys):
    """``simpar keys`` shows defaults, choices and conditions as the readers state them."""
    assert main(["keys", "heat"]) == 0
    out = capsys.readouterr().out
    assert '| `physics.stencil` | `"5pt"` | `"5pt"`, `"9pt"` |' in out
    assert "| `time.dt` | required |" in out
    assert "| `output.every` | depends on other keys |" in out
    assert '| `initial.seed` | `0` | an integer >= 0, <= 9223372036854775807 | only with `initial.kind = "random"` |' in out
    assert main(["keys", "nosuchmodel"]) == 2
    assert "MODEL" in capsys.readouterr().err


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_reach_a_file_and_a_heading():
    bad = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https: and the like
            name, _, anchor = target.partition("#")
            dest = (page.parent / name).resolve() if name else page
            if not dest.exists():
                bad.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", FENCE.sub("", dest.read_text()), re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:tmp|work|root|home|Users|scratch)/[\w.+-]")


def test_no_absolute_machine_path_in_a_tracked_file():
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    bad = []
    for name in filter(None, files):
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if ABSOLUTE.search(line):
                bad.append(f"{name}:{n}: {line.strip()[:100]}")
    assert not bad, "absolute machine paths in tracked files:\n" + "\n".join(bad)
