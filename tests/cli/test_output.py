"""What a person or a pipeline reads: whole messages in the terminal, the run log and
--output json alike; no wrapping when stdout is a pipe or a file; JSON only on stdout."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from gpuboot.ansible.translate import translate
from gpuboot.events import RunFinished, RunStarted
from gpuboot.runlog import RunLog
from gpuboot.ui.console import ConsoleProgress, JsonLines

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "malformed"
# What preflight's one summary looks like on a fleet: long, many lines, brackets included.
SUMMARY = "\n".join(f"gpu{i:02d}: kernel 5.4.0-42-generic is older than 5.12; nvidia-driver-[570] is not in the "
                    f"package repositories of ubuntu-22.04 (add it to the mirror)" for i in range(30))


def test_a_whole_preflight_summary_reaches_terminal_log_and_json(tmp_path):
    failed = translate({"event": "runner_on_failed", "event_data": {
        "host": "cp01", "task": "Preflight | stop with every problem", "res": {"msg": SUMMARY}}})
    log = tmp_path / "run" / "gpuboot.log"
    started = RunStarted("r1", "c", ["preflight"], str(log))
    finished = RunFinished("r1", "failed", ["preflight"], [], str(log), "gpuboot up inv --from preflight", 1.0)

    screen = io.StringIO()
    terminal = ConsoleProgress(Console(file=screen, width=80, soft_wrap=True, highlight=False))
    stream = io.StringIO()
    as_json = JsonLines(stream)
    runlog = RunLog()
    for event in (started, failed, finished):
        terminal(event)
        as_json(event)
        runlog(event)
    for line in SUMMARY.splitlines():
        assert line in screen.getvalue()  # whole lines, not wrapped at 80 columns, brackets kept
    json_events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert next(e for e in json_events if e["event"] == "HostResult")["message"] == SUMMARY
    assert json.dumps(SUMMARY)[1:-1] in log.read_text()


def gpuboot(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuboot", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_output_to_a_pipe_is_never_wrapped():
    case = CORPUS / "tenant_gpu_quota_above_declared.yml"
    proc = gpuboot("validate", str(case))
    assert proc.returncode == 2
    line = next(line for line in proc.stderr.splitlines() if "quota.gpu" in line)
    assert len(line) > 120 and "add up to 20" in line and "(fix: lower the quotas" in line


def test_output_json_prints_only_json_on_stdout_even_for_errors():
    proc = gpuboot("validate", str(CORPUS / "vip_not_ipv4.yml"), "--output", "json")
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["exit_code"] == 2 and error["kind"] == "InventoryError"
    problem = error["problems"][0]
    assert problem["path"] == "gpuboot.control_plane.vip" and problem["line"] and problem["fix"]
    proc = gpuboot("plan", "/nonexistent/inventory.yml", "--output", "json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["problems"][0]["message"] == "no such inventory file"
    proc = gpuboot("plan", str(CORPUS / "vip_not_ipv4.yml"), "--only", "nope", "--output", "json")
    assert json.loads(proc.stdout)["error"]["exit_code"] == 2
