# What every part of native/ is built with, from the top-level CMakeLists.txt or configured on
# its own (cmake -S native/um, cmake -S native/optim: how benchmarks/gpu/run.sh builds them).
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
find_package(pybind11 CONFIG REQUIRED)
