module github.com/pandastack/pandastack/scripts/runsc-precompiled

go 1.26.3

require gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237

require (
	golang.org/x/exp v0.0.0-20250711185948-6ae5c78190dc // indirect
	golang.org/x/mod v0.34.0 // indirect
	golang.org/x/sync v0.20.0 // indirect
	golang.org/x/sys v0.43.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
