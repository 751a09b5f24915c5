"""`bnfix validate`: run the original and the rewritten version side by side and report numbers.

The one part of bnfix that runs user code (a model factory, a training script): it says so in
its help. Frameworks are imported by the runner that needs them.
"""
