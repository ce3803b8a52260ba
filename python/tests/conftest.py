# pytest: put python/ on the path, so that `python3 -m pytest python/tests` imports attn_lineage
# from this checkout.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
