"""A new user's first hour (issue 17, item 7): the README's order and examples, the command
line's stdout contract and help text.

- The Quick start is the README's first section after the one-paragraph intro and the contents.
- The "Writing your own grid model" example (docs/kernels.md) runs as a fresh script (its own
  process, no test set-up: no forced devices, no FMA flag) and its model agrees on all four
  engines.
- ``simpar run`` prints only the JSON summary on stdout, also with ``--show-layout`` (the
  layout goes to stderr), and says on stderr where it wrote.
- ``simpar run --help`` lists the exit codes 0, 1, 2, 130 and 143.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simpar.cli import main
from simpar.testing import user_shell_env

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
KERNELS = (ROOT / "docs" / "kernels.md").read_text()
HEAT = str(ROOT / "experiments/heat2d.toml")
SMALL = ["--set", "grid.shape=[32,32]", "--steps", "4", "--set", "output.every=2"]


def _section(title: str, text: str = README) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]




def test_quick_start_comes_first():
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert headings[0] == "Quick start", headings[:3]
    intro = README[README.index("# simpar\n") : README.index("## Quick start")]
    title, paragraph, contents = intro.strip().split("\n\n")  # title, one paragraph, contents
    assert contents.startswith("**Contents:**") and "(#quick-start)" in contents, contents
    assert "simpar run experiments/heat2d.toml" in _section("Quick start")


def test_own_grid_model_example_runs_on_all_four_engines_in_a_fresh_process(tmp_path):
    section = _section("Writing your own grid model", KERNELS)
    for word in ("padded by `k`", "radius", "bcs", "params"):
        assert word in section, word
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 30, "the example stays short"
    for engine in ("single", "pmap", "shard_map", "sharded"):
        assert f'"{engine}"' in code
    script = tmp_path / "my_model.py"
    script.write_text(code)
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=user_shell_env(ROOT),
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "the 4 engines agree" in r.stdout, r.stdout


def test_run_help_lists_every_exit_code(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    codes = re.findall(r"^  (\d+) +", text[text.index("exit codes:") :], flags=re.M)
    assert codes == ["0", "1", "2", "130", "143"], codes
    assert "SIGTERM" in text and "failed: terminated" in text


@pytest.mark.parametrize("engine,mesh", [("shard_map", "2x4"), ("pmap", "4"), ("single", None)])
def test_show_layout_goes_to_stderr_and_stdout_is_one_json_line(tmp_path, capsys, engine, mesh):
    out = tmp_path / "heat.nc"
    args = ["run", HEAT, *SMALL, "--engine", engine, "--out", str(out), "--show-layout"]
    code = main(args + (["--mesh", mesh] if mesh else []))
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout
    summary = json.loads(lines[0])
    assert summary["path"] == str(out) and summary["run_status"] == "complete"
    assert engine in stderr and "device" in stderr, stderr  # the layout table
    assert f"wrote {out} (3 frames)" in stderr, stderr  # grid runs say where they wrote


def test_quiet_grid_run_prints_only_the_summary(tmp_path, capsys):
    out = tmp_path / "heat.nc"
    code = main(["run", HEAT, *SMALL, "--out", str(out), "--quiet"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert json.loads(stdout)["frames"] == 3 and stderr == "", stderr
