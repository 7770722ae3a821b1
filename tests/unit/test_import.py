import subprocess
import sys


def test_import_does_not_import_torch():
    code = "import sys, trainledger, trainledger.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "trainledger", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "trainledger" in out.stdout
