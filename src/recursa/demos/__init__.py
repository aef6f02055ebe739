"""The demos' cases (`make demo`, examples/) and synthetic traces for tests and benchmarks: built
on the bench's task families, so a front end like the bench itself."""
