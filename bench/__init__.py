"""Side-by-side benchmarks of coil against eager PyTorch and Inductor.

    python -m bench --suite gpu|cpu|smoke [--only NAME] [--out bench/results]

See bench/README.md for what each column means."""
