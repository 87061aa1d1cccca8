"""Launchers: the project's programs started as child processes (a softswitch, a leaf/spine fabric of
them, a controller) and a job written straight into a switch, for the demo, the benchmarks and the tests.

The one package that imports both softswitch and the controller: it sits above them, so that neither
product package imports the other (``tests/test_layout.py``).
"""
