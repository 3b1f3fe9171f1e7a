package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/lab"
)

// apiAddr is the --api flag: a unix socket or http://host:port.
var apiAddr string

func api() (*client.Client, error) {
	c, err := dialAPI()
	if err != nil {
		return nil, err
	}
	c.OnAnswer = answers.record // -o json of a verb that changes intent (answers.go)
	return c, nil
}

func dialAPI() (*client.Client, error) {
	if apiAddr != "" {
		return apiClient(apiAddr)
	}
	name, err := lab.Resolve(lab.DefaultRoot, "")
	if err != nil {
		return nil, fmt.Errorf("no --api given and %w", err)
	}
	st, err := lab.Load(lab.DefaultRoot, name)
	if err != nil {
		return nil, err
	}
	if st.APISocket == "" {
		return nil, fmt.Errorf("lab %q has no controller API (datapath %s)", name, st.Datapath)
	}
	return client.New(st.APISocket), nil
}

// splitPath checks "a/b/c"-style names have n parts.
func splitPath(arg string, n int, shape string) ([]string, error) {
	parts := strings.Split(arg, "/")
	if len(parts) != n {
		return nil, fmt.Errorf("%q: want %s", arg, shape)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("%q: want %s", arg, shape)
		}
	}
	return parts, nil
}

// printJSON writes v to w as indented JSON, the -o json of every verb.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
