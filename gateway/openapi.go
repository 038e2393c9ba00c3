package gateway

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3 document of the API, kept in the repository next to the code and
// checked against the registered routes by TestOpenAPIMatchesRoutes.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3 document served at /v1/openapi.json.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}
