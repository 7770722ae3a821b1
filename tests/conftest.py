import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# estimates and verify runs store records in the ledger: never in the user's home during tests
os.environ.setdefault("TRAINLEDGER_LEDGER", os.path.join(__import__("tempfile").mkdtemp(prefix="tl-tests-"),
                                                         "ledger.db"))
sys.path.insert(0, str(ROOT / "src"))
