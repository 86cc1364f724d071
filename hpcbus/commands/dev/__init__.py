"""Development tools, not `hpcbus` subcommands: the generators of the repository's committed files.
`samples` (`make samples`: deploy/*.toml, the settings tables of the component READMEs and, through `units`,
deploy/systemd/) and `schemas` (`make schemas`: schemas/json/). Tests run them with `--check`."""
