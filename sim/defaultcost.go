package sim

import _ "embed"

// defaultCostJSON is the committed measurement: service-cost.json beside this file.
//
//go:embed service-cost.json
var defaultCostJSON []byte

// DefaultServiceCost is the measurement committed with the simulator (service-cost.json).
func DefaultServiceCost() ServiceCost {
	c, err := ParseServiceCost(defaultCostJSON)
	if err != nil {
		panic("sim: the committed service-cost.json: " + err.Error())
	}
	return c
}
