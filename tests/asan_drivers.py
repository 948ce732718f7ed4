import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 900


@dataclass
class DriverRun:
    returncode: int
    stdout: str
    stderr: str
    passed: int
    failed: int

    def output_tail(self):
        return self.stdout[-4000:] + self.stderr[-4000:]


def run_asan_driver(name, timeout_s=600):
    driver = REPO_ROOT / "build" / "asan" / name
    if not driver.exists():
        subprocess.run(["bash", str(REPO_ROOT / "build.sh"), "asan", "--no-deps"], cwd=REPO_ROOT, check=True,
                       capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    result = subprocess.run([str(driver)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    summary = re.search(r"^(\d+) passed, (\d+) failed$", result.stdout, re.MULTILINE)
    passed, failed = (int(summary.group(1)), int(summary.group(2))) if summary else (-1, -1)
    return DriverRun(result.returncode, result.stdout, result.stderr, passed, failed)


def assert_clean_run(run, minimum_passed):
    assert run.returncode == 0, run.output_tail()
    assert run.passed >= minimum_passed, run.output_tail()
    assert run.failed == 0, run.output_tail()
    assert "ERROR: AddressSanitizer" not in run.stderr
    assert "runtime error" not in run.stderr
