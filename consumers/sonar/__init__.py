"""`hpcbus consume sonar`: the bus's Sonar bridge, line protocol <-> Sonar envelopes, both ways, no loops.

`to_sonar` reassembles lines into envelopes, `to_lp` translates envelopes into lines, `directory` writes the
file tree Jobanalyzer reads, `common` holds the origin mark that keeps the two directions from feeding each
other. README.md in this folder describes the command, its acknowledgement rules and the file names.
"""
