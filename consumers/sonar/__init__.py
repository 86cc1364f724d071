"""`hpcbus consume sonar`: the bus's Sonar bridge, line protocol <-> Sonar envelopes, both ways, no loops.

`to_sonar` reassembles lines into envelopes, `to_lp` translates envelopes into lines, `directory` writes the
file tree Jobanalyzer reads; the origin mark that keeps the two directions from feeding each other is
`hpcbus.outlet`'s. README.md in this folder describes the command, its acknowledgement rules, the file
names and the settings.
"""
