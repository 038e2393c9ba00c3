// Package e2e holds fanin's end-to-end tests: the fanin binary run as real OS processes (gateway,
// placer, runtimes, `fanin dev`) against NATS, driven by SDK workers. `go test -short` skips them.
package e2e
