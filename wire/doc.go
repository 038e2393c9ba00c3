// Package wire is fanin's public wire protocol: subjects, stream names, headers, the encoding of
// gradients and parameters, and the one table of rejection reasons shared by runtime, gateway and SDK.
package wire
