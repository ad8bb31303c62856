// Package deps pins the modules the project depends on until every one of
// them has a real importer; it is removed once they do.
package deps

import (
	_ "github.com/pkg/errors"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/stretchr/testify/assert"
	_ "github.com/stretchr/testify/require"
	_ "go.uber.org/atomic"
)
