// The built-in device catalog: datasheet numbers for common accelerators and the `cpu` type
// used to emulate devices on this machine. Every number's source is in docs/catalog.md.
#pragma once

#include "spec/device_type.hpp"

namespace alloy {

const DeviceCatalog& catalog_builtin();

}  // namespace alloy
