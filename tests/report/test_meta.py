"""The results header: version, commit, command, date and machine, in JSON and CSV files."""

import csv
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

from mcdla.report.meta import meta_comment_lines, results_meta, write_results_csv, write_results_json

_SRC = Path(__file__).resolve().parents[2] / "src" / "mcdla"


def test_meta_names_version_commit_command_date_and_machine():
    """The header's fields agree with the metadata, ``git rev-parse`` and the clock, and keep the command."""
    before = datetime.now(timezone.utc).replace(microsecond=0)
    meta = results_meta(["mcdla", "reproduce", "--out", "my dir"])
    assert meta["mcdla_version"] == importlib.metadata.version("mcdla")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_SRC, capture_output=True, text=True, check=False)
    if head.returncode == 0:
        assert meta["git_commit"].removesuffix("+dirty") == head.stdout.strip()
    else:
        assert meta["git_commit"] is None
    assert meta["command"] == "mcdla reproduce --out 'my dir'"
    when = datetime.fromisoformat(meta["date"])
    assert before <= when <= datetime.now(timezone.utc) + timedelta(seconds=1)
    assert platform.node() in meta["machine"]


def test_json_and_csv_files_carry_the_same_header(tmp_path):
    """results JSON is {meta, rows}; the CSV starts with the same header as '# key: value' lines."""
    rows = [{"a": 1, "b": 2.5}, {"a": 3, "b": None}]
    meta = results_meta(["mcdla", "x"])
    data = json.loads(write_results_json(tmp_path / "r.json", rows, meta).read_text())
    assert data == {"meta": meta, "rows": rows}
    text = write_results_csv(tmp_path / "r.csv", rows, ["a", "b"], meta).read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert dict(line[2:].split(": ", 1) for line in comments) == {k: str(v) for k, v in meta.items()}
    assert meta_comment_lines(meta).splitlines() == comments
    body = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert body == [{"a": "1", "b": "2.5"}, {"a": "3", "b": ""}]


def test_no_commit_for_a_copy_inside_another_repository(tmp_path):
    """A copy of meta.py inside an unrelated git repository (a virtualenv in a user's project) reports no commit."""
    repo = tmp_path / "project"
    (repo / "site").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    copy = repo / "site" / "meta.py"
    shutil.copy(_SRC / "report" / "meta.py", copy)
    spec = importlib.util.spec_from_file_location("meta_copy", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.results_meta(["mcdla"])["git_commit"] is None
