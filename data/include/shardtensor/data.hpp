#pragma once
// Umbrella header of the data module: the heat-equation data generator.

#include "shardtensor/data/heat_equation.hpp"
