"""Cold vs warm rank pool: time to the first record of a 4-rank run.

    python benchmarks/warm_pool.py [--repeats 3]
"""
import argparse

from dtlab.bench import pool

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    pool.run(parser.parse_args())
