"""`make bench`: every benchmark measures hpcbus against a baseline in the same run and prints the ratio.

The machine is small and noisy, so only ratios mean anything; each figure is the best of several repeats.
"""
