"""Figure 2 of the paper: low-rank against independence (see lowrank_vs_independent.py).

    python pipelines/fig2_local_sizes.py [--quick|--full] [--out DIR] [--replicates R] [--workers W]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lowrank_vs_independent import main

if __name__ == "__main__":
    sys.exit(main(figure=2))
