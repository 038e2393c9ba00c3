// Package job defines a training job as fanin sees it: the spec a user submits, its validation, and
// the shard layout that workers and runtimes derive from it identically.
package job
