// The wrapper is its own module only so that `go vet ./...` and `go test ./...`
// run here; build.sh copies the non-test .go files into the temporary main module.
module slessrt

go 1.23
