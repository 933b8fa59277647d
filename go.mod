module github.com/pandastack/pandastack

go 1.26.0

require github.com/hashicorp/yamux v0.1.2
