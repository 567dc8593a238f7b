"""The numbers read from run records: estimates, intervals, gap tables, verdicts, the studies' rows.

Pure functions of plain rows (no I/O, no plotting), below the experiments that
print them and the report that judges and draws them, so a table in the
terminal and the same table in the report are one computation:
``estimates`` (means, SEs, how they are written), ``intervals`` (Student's t,
paired differences, Holm), ``judging`` (the verdict rule), ``gaps`` (the
perplexity gap and where it starts), ``budget`` (what a group of runs was
given), ``course_figures`` (the course's end-of-training figures),
``schemes`` and ``setups`` (the two studies beyond the course)."""
