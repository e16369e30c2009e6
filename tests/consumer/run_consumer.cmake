# ctest driver: install the just-built package into a scratch prefix, configure and build the
# consumer project against it, and run it. Invoked with -DBUILD_DIR -DSOURCE_DIR -DGENERATOR.
set(prefix "${BUILD_DIR}/consumer-test/prefix")
set(consumer_build "${BUILD_DIR}/consumer-test/build")
file(REMOVE_RECURSE "${BUILD_DIR}/consumer-test")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "failed (${status}): ${ARGN}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" --component cpp)
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${consumer_build}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}")
run(${CMAKE_COMMAND} --build "${consumer_build}")
run("${consumer_build}/consumer")
