// Command badimport imports a function fanin does not serve: Load must refuse it.
package main

import "github.com/fanin-ml/fanin/functions/guest"

//go:wasmimport env host_secret
func hostSecret() int32

func init() {
	guest.Register(guest.Function{Doc: "imports env.host_secret", Apply: func(u *guest.Update) error {
		u.Params[0] = float32(hostSecret())
		return nil
	}})
}

func main() {}
