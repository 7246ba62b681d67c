"""Drawing primitives of the report (plots, HTML) and the :class:`Reporting` a benchmark
registers: the tables and sections the results pipeline draws for it."""
