// Package image builds fanin's container image without a Docker daemon or a base image: the static
// fanin binary and a nonroot user in one layer, the same bytes for the same binary and metadata.
package image
