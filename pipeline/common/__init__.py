"""What the kinds and the pipeline that iterates over them share: the kind protocol, the preflight's verdicts, the
cell flows' parameters, planning with I/O, and the steps every kind's run takes (pull, publish). Nothing here names
a kind or imports the modules above it."""
