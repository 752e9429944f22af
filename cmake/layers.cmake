# lathe_layer(NAME DIR [DEPS ...]): one static library per src/ folder, built
# from every .cpp in it. New files need no CMake edit.
function(lathe_layer name dir)
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${dir}/*.cpp)
  list(FILTER _srcs EXCLUDE REGEX "/main\\.cpp$")
  if(NOT _srcs)
    set(_srcs ${CMAKE_SOURCE_DIR}/cmake/empty.cpp)
  endif()
  add_library(${name} STATIC ${_srcs})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_link_libraries(${name} PUBLIC ${ARGN})
endfunction()

# lathe_test(LAYER_DIR [DEPS ...]): one GoogleTest binary per tests/ folder.
function(lathe_test dir)
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${dir}/*.cpp)
  if(NOT _srcs)
    return()
  endif()
  string(REPLACE "/" "_" _name "test_${dir}")
  add_executable(${_name} ${_srcs})
  target_include_directories(${_name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(${_name} PRIVATE ${ARGN} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${_name} PRIVATE
    LATHE_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    LATHE_TEST_DATA="${CMAKE_SOURCE_DIR}/tests/data"
    LATHE_BINARY_DIR="${CMAKE_BINARY_DIR}")
  gtest_discover_tests(${_name} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS ${dir} TIMEOUT 600)
endfunction()
