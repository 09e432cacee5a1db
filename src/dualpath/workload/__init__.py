"""Agentic workloads: trajectories, the Table 2 generator, replay (A.3) and trace readers/writers."""

from dualpath.workload.trajectory import Round, Trajectory, replay_trajectories

__all__ = ["Round", "Trajectory", "replay_trajectories"]
