"""The rules on a job of many ranks over many nodes, judged across its exporters.

``deaths``: a rank of the job died, was stopped by a signal, or the job restarted
(TrainingJobRankDied, TrainingJobTerminated, TrainingJobRestarted); ``stall``: the job stopped
stepping or never started (TrainingJobStalled, TrainingJobNoFirstStep); ``slow``: which rank
holds the others up (TrainingRankSlow). Each compares the job's ranks by the target labels
without ``instance`` plus ``run``, and each is a group of its own.
"""
