"""What both sides read and write the same way.

The heartbeat and manifest formats, checkpoint name patterns, the verdict of which checkpoint is
complete, how files are opened, the state directory and process identity. Standard library and
psutil only.
"""
