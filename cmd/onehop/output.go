package main

import (
	"fmt"

	"github.com/spf13/pflag"
)

// outputFormat is every command's -o: text (tables for people) or json
// (the API's own objects, for scripts). A wrong value is refused while the
// flags are parsed, naming the flag and the choices, before anything is
// asked of the controller or a daemon.
type outputFormat string

const (
	textOutput outputFormat = "text"
	jsonOutput outputFormat = "json"
)

// String implements pflag.Value.
func (o *outputFormat) String() string { return string(*o) }

// Set implements pflag.Value.
func (o *outputFormat) Set(v string) error {
	switch f := outputFormat(v); f {
	case textOutput, jsonOutput:
		*o = f
		return nil
	}
	return fmt.Errorf("want text or json")
}

// Type implements pflag.Value: what --help shows as the value.
func (o *outputFormat) Type() string { return "text|json" }

// addOutputFlag adds -o/--output to fs, text by default.
func addOutputFlag(fs *pflag.FlagSet, o *outputFormat) {
	*o = textOutput
	fs.VarP(o, "output", "o", "output format: text (a table) or json (the API's objects)")
}
