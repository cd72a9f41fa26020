"""Neighbour search for NEC's DND: the libraries measured on one update's work.

One NEC update on a batch of B items looks up k = 50 neighbours of B queries in a DND of C
keys, then moves keys (B writes, and the gradient step on the B x k neighbours it looked up).
An index must therefore follow keys that change at every update. Per library, the figures:

- query: B queries of k neighbours against an index that is up to date;
- refresh: bringing the index up to date after an update (a rebuild for trees; re-adding the
  moved keys for hnswlib; nothing for an exact search over the live array);
- update: query + refresh, the cost an update pays; and recall@k against exact search.

    .venv/bin/python benchmarks/dnd_neighbours.py [--capacity 50000] [--dim 32] [--batch 32]

Libraries not installed are skipped (faiss-cpu, hnswlib, scikit-learn, scipy); torch's exact
search (cdist and topk, one thread) is the reference.
"""

import argparse
import time

import numpy as np


def timed(function, repeats: int) -> float:
    """Median seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def exact(keys: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    distances = (queries**2).sum(1)[:, None] - 2 * queries @ keys.T + (keys**2).sum(1)[None]
    return np.argpartition(distances, k, axis=1)[:, :k]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(
        np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((args.capacity, args.dim)).astype(np.float32)
    queries = rng.standard_normal((args.batch, args.dim)).astype(np.float32)
    moved = rng.choice(args.capacity, min(args.capacity, args.batch * (args.k + 1)), replace=False)
    truth = exact(keys, queries, args.k)
    k, n = args.k, args.repeats
    print(f"C = {args.capacity} keys of {args.dim}, B = {args.batch} queries, k = {k}")
    print(f"{'library':<28} {'query ms':>9} {'refresh ms':>11} {'update ms':>10} {'recall':>7}")

    def row(name: str, query: float, refresh: float, found: np.ndarray) -> None:
        print(
            f"{name:<28} {query * 1e3:>9.2f} {refresh * 1e3:>11.2f}"
            f" {(query + refresh) * 1e3:>10.2f} {recall(found, truth):>7.3f}"
        )

    try:
        import faiss

        faiss.omp_set_num_threads(1)
        query = timed(lambda: faiss.knn(queries, keys, k), n)
        row("faiss.knn (exact, 1 thread)", query, 0.0, faiss.knn(queries, keys, k)[1])
    except ImportError:
        print("faiss-cpu not installed")
    import torch

    torch.set_num_threads(1)
    keys_t, queries_t = torch.from_numpy(keys), torch.from_numpy(queries)
    query = timed(lambda: torch.cdist(queries_t, keys_t).topk(k, largest=False), n)
    found = torch.cdist(queries_t, keys_t).topk(k, largest=False).indices.numpy()
    row("torch cdist + topk (exact)", query, 0.0, found)
    try:
        import hnswlib

        index = hnswlib.Index(space="l2", dim=args.dim)
        index.init_index(max_elements=args.capacity, ef_construction=100, M=16)
        index.set_num_threads(1)
        started = time.perf_counter()
        index.add_items(keys, np.arange(args.capacity))
        build = time.perf_counter() - started
        index.set_ef(max(k, 64))
        query = timed(lambda: index.knn_query(queries, k), n)
        refresh = timed(lambda: index.add_items(keys[moved], moved), n)  # same labels: update
        row(f"hnswlib (build {build:.1f} s)", query, refresh, index.knn_query(queries, k)[0])
    except ImportError:
        print("hnswlib not installed")
    try:
        from sklearn.neighbors import KDTree

        tree = KDTree(keys)
        query = timed(lambda: tree.query(queries, k), n)
        refresh = timed(lambda: KDTree(keys), max(3, n // 5))
        row("scikit-learn KDTree", query, refresh, tree.query(queries, k)[1])
    except ImportError:
        print("scikit-learn not installed")
    try:
        from scipy.spatial import cKDTree

        tree = cKDTree(keys)
        query = timed(lambda: tree.query(queries, k), n)
        refresh = timed(lambda: cKDTree(keys), max(3, n // 5))
        row("scipy cKDTree", query, refresh, tree.query(queries, k)[1])
    except ImportError:
        print("scipy not installed")


if __name__ == "__main__":
    main()
