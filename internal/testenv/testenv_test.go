package testenv

import "testing"

func TestInCIReadsTheCIVariable(t *testing.T) {
	t.Setenv("CI", "true")
	if !InCI() {
		t.Fatal("CI=true not seen")
	}
	t.Setenv("CI", "")
	if InCI() {
		t.Fatal("empty CI taken for CI")
	}
}
