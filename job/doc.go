// Package job defines a training job as fanin sees it: the spec a user submits (decoded strictly
// from JSON here, from JSON or YAML by package job/jobyaml), its validation, and the shard layout
// that workers and runtimes derive from it identically.
package job
