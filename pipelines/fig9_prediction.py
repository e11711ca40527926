"""Figure 9 of the paper (see async_vs_sync.py for what it runs and writes).

    python pipelines/fig9_prediction.py [--quick|--full] [--out DIR] [--runtime virtual|dask] [--preset P] [--replot]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_vs_sync import main

if __name__ == "__main__":
    sys.exit(main(figure=9))
