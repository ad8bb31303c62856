//go:build cuda

package deps

import _ "gorgonia.org/cu"
