"""What a provider plugin's own tests use: `recursa.testing.conformance` (the conformance
suite every hosted provider passes, for pytest) and `recursa.testing.wire` (the fake wires it
runs over). Nothing in recursa imports this package, so `import recursa` never loads pytest.
"""
