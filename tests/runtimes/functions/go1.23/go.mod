module example.com/sless/testfunction

go 1.23
