import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DRIVER = REPO_ROOT / "build" / "asan" / "test_live_set"


def build_asan_driver():
    subprocess.run(["bash", str(REPO_ROOT / "build.sh"), "asan", "--no-deps"], cwd=REPO_ROOT, check=True,
                   capture_output=True, text=True, timeout=900)


def test_live_request_table_driver_passes_under_address_sanitizer():
    if not DRIVER.exists():
        build_asan_driver()
    result = subprocess.run([str(DRIVER)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = re.search(r"^(\d+) passed, (\d+) failed$", result.stdout, re.MULTILINE)
    assert summary is not None, result.stdout
    assert int(summary.group(1)) >= 15
    assert int(summary.group(2)) == 0
    assert "ERROR: AddressSanitizer" not in result.stderr
    assert "runtime error" not in result.stderr
