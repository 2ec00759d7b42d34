"""rlsched: learned, contention- and locality-aware GPU placement for Slurm."""

__version__ = "0.1.0"
