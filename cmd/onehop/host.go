package main

import (
	"fmt"
	"io"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
)

// Hosts come from the topology (or the operator's store); the CLI only lists them.
var hostListing = listing{kind: "hosts", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return listAndPrint(c, "/v1/hosts", output, w, "HOST\tFABRIC ADDRESS", func(h intent.Host) string {
		return fmt.Sprintf("%s\t%s", h.Name, h.Address)
	})
}}
